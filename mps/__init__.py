"""Managing NVIDIA's MPS control daemon (issue #6); empty until then."""
