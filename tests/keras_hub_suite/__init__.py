"""keras-hub's tests on our layer (README.md here)."""
