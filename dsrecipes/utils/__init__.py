"""Small shared utilities: devices, seeding, logging."""
