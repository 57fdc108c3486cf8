"""The tuner: measurement inputs, correctness gate and timing, the restartable device
worker, the tuner's compile step, the Optuna search and its progress display."""
