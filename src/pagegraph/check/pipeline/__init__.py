"""The check pipeline: its phases and replay loop, the two benches (tables, decode step), the state
and buffers they run on."""
