"""noded's control plane transport: one bounded server for stream sockets (Unix and
TCP) that the admin socket, the report socket and the metrics endpoint all use, and
the descriptor budget it lives within."""
