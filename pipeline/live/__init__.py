"""Live rounds (docs/live.md): questions published before the events they ask about happen."""
