"""What runs on the device: one problem's inputs, reference, check and timing, and the device's measured limits."""
