"""Shape sets -> tuning problems: the YAML schema, model presets, Hugging Face configs, and the size limits."""
