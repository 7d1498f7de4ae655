"""The default schedule of a kernel, without search (`schedule.default_schedule`): the
kernel's sketch (`sketch`, the template the search samples from too) under the default
decisions (`decide`), which the conv plan (`conv`) and the matrix-product plan's rules
(`rules`) derive; `steps` holds the steps every plan shares."""
