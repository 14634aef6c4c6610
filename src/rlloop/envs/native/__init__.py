"""Native batched torch environments."""
