"""The default schedule of a kernel, without search (`schedule.default_schedule`), with its
conv plan (`conv`) and the steps its plans share (`steps`)."""
