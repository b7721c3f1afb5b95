"""The check's judges: the replay model, the exact verification and every judgment."""
