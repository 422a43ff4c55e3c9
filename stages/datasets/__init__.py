"""The SFT data build's parts: sources, teachers, filters, Parquet shards and the data card (the sft_data kind's run
function, stages/kinds/sft_data/run_sft_data.py)."""
