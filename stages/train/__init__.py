"""What a training stage does with a model: load it (model, model_source, tokenizer), sample it (completions,
rollout, rollout_ahead), score its tokens and step it (losses, training, lora, packing, precision), in the context
a stage runs in (context)."""
