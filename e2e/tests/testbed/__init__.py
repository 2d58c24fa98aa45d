"""The test bed must-show list: real controllers, real API semantics, host processes."""
