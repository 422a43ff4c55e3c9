"""What a run is, from configs alone: the recipe's schema and file, every stage's shared config bases, the walk of
the cascade and the dry run's plan and estimates."""
