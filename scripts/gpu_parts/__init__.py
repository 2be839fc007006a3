"""The parts of scripts/gpu_check.py, one module each, and the harness they share."""
