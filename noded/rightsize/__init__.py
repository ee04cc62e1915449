"""Right-sizing the CPU side of GPU jobs (issue #13): curves, signal, allocator, history."""
