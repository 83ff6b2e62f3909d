"""caffe2.python.experiment_util: ModelTrainerLog, a run's statistics (loss, accuracy, throughput...) appended as
CSV lines to `<experiment id>.log` in the working directory (the first line the run's arguments, then a header),
logged to the "experiment_logger" logger and passed to optional ExternalLoggers."""
from __future__ import annotations

import abc
import datetime
import logging
import socket
import time
from collections import OrderedDict


class ExternalLogger(abc.ABC):
    """A destination of its own for the log lines: set_runtime_args once, then log(dict) per line."""

    @abc.abstractmethod
    def set_runtime_args(self, runtime_args):
        raise NotImplementedError("Must define set_runtime_args function to use this base class")

    @abc.abstractmethod
    def log(self, log_dict):
        raise NotImplementedError("Must define log function to use this base class")


class ModelTrainerLog:
    def __init__(self, expname, runtime_args, external_loggers=None):
        stamp = datetime.datetime.fromtimestamp(time.time()).strftime("%Y%m%d_%H%M%S")
        self.experiment_id = f"{expname}_{stamp}"
        self.filename = f"{self.experiment_id}.log"
        self.logstr(f"# {runtime_args}")
        self.headers = None
        self.start_time = self.last_time = time.time()
        self.last_input_count = 0
        self.external_loggers = list(external_loggers or [])
        if self.external_loggers:
            args = dict(runtime_args if isinstance(runtime_args, dict) else vars(runtime_args))
            args.update(experiment_id=self.experiment_id, hostname=socket.gethostname())
            for logger in self.external_loggers:
                logger.set_runtime_args(args)

    def logstr(self, text):
        with open(self.filename, "a") as f:
            f.write(text + "\n")
        logging.getLogger("experiment_logger").info(text)

    def log(self, input_count, batch_count, additional_values):
        """One line: time since the last line and in all, inputs since the last and in all, batches, inputs per
        second, then additional_values by sorted key."""
        now = time.time()
        delta_t, delta_count = now - self.last_time, input_count - self.last_input_count
        self.last_time, self.last_input_count = now, input_count
        line = OrderedDict(time_spent=delta_t, cumulative_time_spent=now - self.start_time, input_count=delta_count,
                           cumulative_input_count=input_count, cumulative_batch_count=batch_count,
                           inputs_per_sec=delta_count / delta_t if delta_t > 0 else 0.0)
        for key in sorted(additional_values):
            line[key] = additional_values[key]
        if self.headers is None:
            self.headers = list(line)
            self.logstr(",".join(self.headers))
        self.logstr(",".join(str(v) for v in line.values()))
        for logger in self.external_loggers:
            try:
                logger.log(line)
            except Exception as e:  # noqa: BLE001 - an outside logger's failure only warns, as in Caffe2
                logging.warning(f"Failed to call ExternalLogger: {e}")
