"""Building nets from Python: NetBuilder (close to Caffe2's core.Net), ModelBuilder (an init net and a main
net with parameters and layer helpers), the recurrent layers and cells, unrolled RNNs, and synth-init's random
weights for weightless predict nets."""
