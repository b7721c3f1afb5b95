"""The check's judges: the model of each replay, the exact verification, and the properties'
judgments."""
