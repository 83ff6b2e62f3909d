"""Stand-in for matplotlib.cm: the colormap names the tutorials pass to imshow."""
gray = "gray"
