"""What a bot team's own integration tests need to run the worker for real (containers, fixtures)."""
