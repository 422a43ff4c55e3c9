"""A folder of stage kinds outside stages/kinds/, laid out as the built-in ones are: one folder per kind. Loaded with
`load_kinds` (stages/kinds/registry.py), the call that loads the built-in kinds."""
