"""NodeImage: replace every node whose image is not the desired one, one safe step per pass."""
