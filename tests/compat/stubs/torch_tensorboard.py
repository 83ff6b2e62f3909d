"""Stand-in for torch.utils.tensorboard where the tensorboard package is missing (see README.md): DLRM's
dlrm_s_pytorch.py imports SummaryWriter at the top and logs its losses and accuracies to it, which writes
TensorBoard event files under ./runs and prints nothing. This writer takes the same calls and keeps them in
CALLS; what the program prints is unchanged. The test that runs the program installs it as
sys.modules["torch.utils.tensorboard"] (a module inside torch, so it cannot come first on sys.path)."""
CALLS = []


class SummaryWriter:
    def __init__(self, log_dir=None, *args, **kwargs):
        self.log_dir = log_dir

    def add_scalar(self, tag, value, step=None, *args, **kwargs):
        CALLS.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        pass
