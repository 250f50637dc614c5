"""What the trainer and the command line check and set about the machine and the user's input before any compute:
torch's thread count on CPU (`cpu_threads`), and that a model's name is a directory or a Hub id (`model_path`)."""
