"""The toy engine's planning: its decisions and its planner."""
