"""Jobs, sensors and schedules of the learning loop."""
