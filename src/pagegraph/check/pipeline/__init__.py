"""The check pipeline: its phases and loop, both benches, and the state they run on."""
