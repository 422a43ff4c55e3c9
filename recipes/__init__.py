"""The shipped recipes (`cascade run NAME` finds NAME.yaml here), installed as package data."""
