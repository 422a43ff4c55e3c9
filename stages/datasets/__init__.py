"""The SFT data build's parts: sources, teachers, filters, Parquet shards and the data card (stages/sft_data.py)."""
