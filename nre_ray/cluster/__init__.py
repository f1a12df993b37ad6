"""The Ray cluster: start or join it, size the workers, and the local stand-in of the cloud cluster."""
