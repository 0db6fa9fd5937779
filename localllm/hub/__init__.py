"""Where models come from: the local store, the built-in default model, aliases and pulls."""
