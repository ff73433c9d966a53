"""What several test modules share: environments, fixtures' builders, batteries and checks (never a test module)."""
