"""GPU devices in a checkpoint: the CUDA driver's process checkpoint API and the device-state step."""
