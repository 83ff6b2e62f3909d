"""Caffe2's checkpoint module: Job (the init, epoch, download and exit TaskGroups of a training job), JobRunner
(runs them, saving a checkpoint of every node's global workspace before the first epoch and after each one, and
resuming from a saved epoch), the checkpoint managers (CheckpointManager for one node, MultiNodeCheckpointManager
for several) and epoch_limiter.

A checkpoint of epoch E on node N is the db '<db_prefix>/<N>.<E>' (db_name), written by a Save of the blobs
that were in the node's workspace once the init group had run (GetAllBlobNames; the list itself is among them,
as the blob 'blob_names'), with absolute_path=1: the path is the program's own. A failed save is logged and the job
goes on, as in Caffe2.
"""
from __future__ import annotations

import logging
import os

from . import context, core
from .net_builder import ops
from .task import Node, Task, TaskGroup, TaskOutput, WorkspaceType

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)


@context.define_context()
class Job:
    """Four TaskGroups run by a JobRunner: init_group once (global blobs: weights, readers), epoch_group in a
    loop until a stop signal (add_stop_signal) is true after an epoch, download_group and exit_group once at the
    end. Inside `with Job():` new Tasks go to the epoch group."""

    def __init__(self, init_group=None, epoch_group=None, download_group=None, exit_group=None,
                 stop_signals=None, nodes_to_checkpoint=None):
        self.init_group = init_group or TaskGroup(workspace_type=WorkspaceType.GLOBAL)
        self.epoch_group = epoch_group or TaskGroup()
        self.download_group = download_group or TaskGroup()
        self.exit_group = exit_group or TaskGroup()
        self.stop_signals = stop_signals or []
        self._nodes_to_checkpoint = nodes_to_checkpoint

    def nodes_to_checkpoint(self) -> list:
        """The nodes given, else those the init group uses."""
        return self._nodes_to_checkpoint or self.init_group.used_nodes()

    def compile(self, session_class):
        """The job with every group compiled for session_class."""
        return Job(init_group=session_class.compile(self.init_group),
                   epoch_group=session_class.compile(self.epoch_group),
                   download_group=session_class.compile(self.download_group),
                   exit_group=session_class.compile(self.exit_group),
                   stop_signals=self.stop_signals, nodes_to_checkpoint=self.nodes_to_checkpoint())

    def __enter__(self):
        self.epoch_group.__enter__()
        return self

    def __exit__(self, *args):
        self.epoch_group.__exit__()

    def add_stop_signal(self, output) -> None:
        """Stop after the epoch in which this blob (made an output of a new epoch task) or TaskOutput is true."""
        if isinstance(output, core.BlobReference):
            output = Task(outputs=[output], group=self.epoch_group).outputs()[0]
        if not isinstance(output, TaskOutput):
            raise AssertionError(f"a stop signal must be a BlobReference or TaskOutput, got {type(output).__name__}")
        self.stop_signals.append(output)


def get_ckpt_filename(node_name, epoch) -> str:
    """'<node_name>.<epoch>'."""
    return f"{node_name}.{epoch}"


def db_name(epoch, node_name, db_prefix, path_prefix=None) -> str:
    """The checkpoint's db: path_prefix + filename when path_prefix is given, else db_prefix/filename."""
    if path_prefix:
        return path_prefix + get_ckpt_filename(node_name, epoch)
    return os.path.join(db_prefix, get_ckpt_filename(node_name, epoch))


class _MetadataHooks:
    """What both managers do with an optional metadata_handler (write, last_epoch, set_params, cp_accessible)."""

    _metadata_handler = None

    def write_checkpoint_metadata(self, epoch) -> None:
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch=None):
        """The epoch to resume from: the handler's last epoch, else user_epoch (None: start afresh)."""
        if self._metadata_handler is not None:
            return self._metadata_handler.last_epoch(user_epoch=user_epoch)
        return user_epoch

    def cp_accessible(self, epoch=None) -> bool:
        """Whether the checkpoint (of epoch, or the directory) can be reached: the handler's answer, else True."""
        if self._metadata_handler is not None:
            return self._metadata_handler.cp_accessible(epoch)
        return True

    def _set_handler_params(self, node_names) -> None:
        if self._metadata_handler:
            self._metadata_handler.set_params(db_prefix=self._db_prefix, db_type=self._db_type,
                                              node_names=node_names, path_prefix=self._path_prefix,
                                              path_type=self._path_type)


class CheckpointManager(_MetadataHooks):
    """Saves and loads the global workspace of one node (node_name) to dbs of db_type under db_prefix."""

    def __init__(self, db_prefix, node_name, db_type, metadata_handler=None):
        self._db_prefix = db_prefix
        self._node_name = node_name
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._net = core.Net("!!checkpoint_mngr")
        self._blob_names = self._net.AddExternalInput("blob_names")
        self._names_output = None
        self._path_prefix = None
        self._path_type = None

    def init(self, nodes=None, retrieve_from_epoch=None, path_prefix=None, path_type=None):
        """A Task (run after the init group) making the list of blobs to checkpoint: the workspace's blobs, or
        with retrieve_from_epoch the list saved in that epoch's checkpoint."""
        if nodes is not None and len(nodes) != 1:
            raise AssertionError("CheckpointManager only supports single node.")
        with Task(outputs=[self._blob_names]) as task:
            if retrieve_from_epoch is None:
                ops.GetAllBlobNames([], self._blob_names, include_shared=False)
            else:
                full_db_name = db_name(retrieve_from_epoch, self._node_name, self._db_prefix, path_prefix)
                logger.info("Initializing checkpoints from = %s", full_db_name)
                ops.Load([], self._blob_names, db=full_db_name, db_type=path_type or self._db_type,
                         absolute_path=True)
        self._names_output = task.outputs()[0]
        return task

    def blob_list(self) -> list:
        """The names init found (it must have run): str, as names are given to ops."""
        if not self._names_output:
            raise AssertionError("init must be run first")
        return [n.decode("utf-8") if isinstance(n, bytes) else n for n in self._names_output.fetch().tolist()]

    def load(self, epoch, path_prefix=None, path_type=None):
        """A Task loading every checkpointed blob from the epoch's db."""
        full_db_name = db_name(epoch, self._node_name, self._db_prefix, path_prefix)
        logger.info("Loading checkpoints from = %s", full_db_name)
        with Task() as task:
            ops.Load([], self.blob_list(), db=full_db_name, db_type=path_type or self._db_type, absolute_path=True)
        return task

    def load_blobs_from_checkpoint(self, blob_names, epoch):
        """A Task loading those of blob_names that the epoch's db holds (allow_incomplete)."""
        full_db_name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Load from %s", full_db_name)
        with Task() as task:
            ops.Load([], blob_names, db=full_db_name, db_type=self._db_type, absolute_path=True,
                     allow_incomplete=True)
        return task

    def check_db_exists(self, epoch):
        """A Task whose output is a bool: whether the epoch's db exists."""
        full_db_name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Check existence of %s", full_db_name)
        with Task() as task:
            existence = ops.Const(False)
            ops.DBExists([], [existence], db_name=full_db_name, db_type=self._db_type, absolute_path=True)
            task.add_output(existence)
        return task

    def save(self, epoch):
        """A Task saving the checkpointed blobs to the epoch's db."""
        full_db_name = db_name(epoch, self._node_name, self._db_prefix)
        logger.info("Saving to %s", full_db_name)
        with Task() as task:
            ops.Save(self.blob_list(), [], db=full_db_name, db_type=self._db_type, absolute_path=True)
        return task

    def set_params(self, nodes, path_prefix=None, path_type=None) -> None:
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        self._set_handler_params([str(self._node_name)])


class MultiNodeCheckpointManager(_MetadataHooks):
    """One CheckpointManager per node (made by init or load_blobs_locally); init, load and save give TaskGroups
    with a task on every node."""

    def __init__(self, db_prefix, db_type, metadata_handler=None):
        self._node_managers = None
        self._db_prefix = db_prefix
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._path_prefix = None
        self._path_type = None

    def _task_group(self, func, *args, **kw):
        if self._node_managers is None:
            raise AssertionError("init must be called first.")
        with TaskGroup(WorkspaceType.GLOBAL) as task_group:
            for node, manager in self._node_managers:
                with Node(node):
                    func(manager, *args, **kw)
            return task_group

    def _make_managers(self, nodes) -> None:
        self._node_managers = []
        for node in nodes:
            with Node(node):
                manager = CheckpointManager(db_prefix=self._db_prefix, node_name=str(node), db_type=self._db_type)
                self._node_managers.append((node, manager))

    def _check_nodes(self, nodes) -> None:
        if [node for node, _ in self._node_managers] != nodes:
            raise AssertionError("the checkpoint manager was set up for other nodes")

    def init(self, nodes, retrieve_from_epoch=None, path_prefix=None, path_type=None):
        """The managers' init tasks; an empty group when already initialized (for the same nodes)."""
        if self._node_managers is not None:
            self._check_nodes(nodes)
            return TaskGroup(WorkspaceType.GLOBAL)
        self._make_managers(nodes)
        return self._task_group(CheckpointManager.init, nodes=[nodes[-1]] if nodes else None,
                                retrieve_from_epoch=retrieve_from_epoch, path_prefix=path_prefix,
                                path_type=path_type)

    def load(self, epoch, path_prefix=None, path_type=None):
        return self._task_group(CheckpointManager.load, epoch, path_prefix=path_prefix, path_type=path_type)

    def load_blobs_locally(self, nodes, blob_names, epoch, session) -> bool:
        """Load blob_names from every node's checkpoint of epoch into the session's workspace; False (nothing
        more loaded) at the first node whose db does not exist."""
        if self._node_managers is not None:
            self._check_nodes(nodes)
        else:
            self._make_managers(nodes)
        for _, manager in self._node_managers:
            existence_task = manager.check_db_exists(epoch)
            session.run(existence_task)
            if not existence_task.outputs()[0].fetch():
                logger.info("DB %s does not exist!", db_name(epoch, manager._node_name, manager._db_prefix))
                return False
            session.run(manager.load_blobs_from_checkpoint(blob_names, epoch))
        logger.info("Successfully loaded from checkpoints.")
        return True

    def get_ckpt_db_name(self, node_name, epoch):
        """The db of node_name's checkpoint of epoch (None for a node it does not manage)."""
        for node, manager in self._node_managers:
            if str(node) == node_name:
                return db_name(epoch, manager._node_name, manager._db_prefix)
        return None

    def save(self, epoch):
        return self._task_group(CheckpointManager.save, epoch)

    def set_params(self, nodes, path_prefix=None, path_type=None) -> None:
        self._node_names = [str(node) for node in nodes]
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        self._set_handler_params(self._node_names)


class UploadTaskGroupBuilder:
    """Makes the TaskGroup that uploads the checkpoints once training ends (subclasses implement build)."""

    def build(self, epoch, checkpoint_manager):
        """The upload TaskGroup for the checkpoints of epoch."""
        raise NotImplementedError()


class JobRunner:
    """Runs a Job with a session (`runner(session)` returns the last epoch): the init group (unless resuming),
    checkpoints after init (epoch 0) and after each epoch, resume_from_epoch loading that checkpoint instead of
    running the init group."""

    def __init__(self, job, checkpoint_manager=None, resume_from_epoch=None, upload_task_group_builder=None):
        self.resume_from_epoch = resume_from_epoch
        self.checkpoint_manager = checkpoint_manager
        self.job = job
        self.upload_task_group_builder = upload_task_group_builder

    def __call__(self, session):
        manager = self.checkpoint_manager
        if manager:
            manager.set_params(nodes=self.job.nodes_to_checkpoint())
            self.resume_from_epoch = manager.get_resume_from_epoch_id(self.resume_from_epoch)
            if self.resume_from_epoch is not None:
                logger.info("Resuming from epoch %s", self.resume_from_epoch)
        from_scratch = self.resume_from_epoch is None
        if from_scratch:
            session.run(self.job.init_group)
        if manager:
            logger.info("Preparing checkpoints ...")
            session.run(manager.init(self.job.nodes_to_checkpoint(), retrieve_from_epoch=self.resume_from_epoch))
            if from_scratch:
                self.save_checkpoints(0, session)
            else:
                logger.info("Loading checkpoints for epoch %s ...", self.resume_from_epoch)
                session.run(manager.load(self.resume_from_epoch))
                logger.info("Checkpoint loaded")
        logger.info("Finished initializing")
        epoch = 1 if from_scratch else self.resume_from_epoch + 1
        while True:
            logger.info("Starting epoch %d", epoch)
            session.run(self.job.epoch_group)
            logger.info("Finished epoch %d", epoch)
            stop_signals = [o.fetch() for o in self.job.stop_signals]
            if manager:
                self.save_checkpoints(epoch, session)
            if any(stop_signals):
                logger.info("Stopping")
                break
            epoch += 1
        logger.info("Finished training")
        if self.upload_task_group_builder:
            session.run(self.upload_task_group_builder.build(epoch, manager))
            logger.info("Finished uploading the checkpoints")
        session.run(self.job.download_group)
        logger.info("Finished downloading the parameters")
        session.run(self.job.exit_group)
        logger.info("Finished running the exit group")
        return epoch

    def load_blobs_from_checkpoints(self, blob_names, epoch, session) -> bool:
        """Load only blob_names from every node's checkpoint of epoch (e.g. a model to evaluate)."""
        if not self.checkpoint_manager:
            raise ValueError("Checkpoint manager is None")
        logger.info("Loading checkpoint for epoch %s ...", epoch)
        return self.checkpoint_manager.load_blobs_locally(self.job.nodes_to_checkpoint(), blob_names, epoch,
                                                          session)

    def save_checkpoints(self, epoch, session) -> None:
        """Save the checkpoint of epoch; a failure is logged, not raised (the job goes on)."""
        if not self.checkpoint_manager:
            raise ValueError("Checkpoint manager is None")
        try:
            if self.checkpoint_manager.cp_accessible(epoch=None):
                logger.info("Saving checkpoints for epoch %s", epoch)
                session.run(self.checkpoint_manager.save(epoch))
                self.checkpoint_manager.write_checkpoint_metadata(epoch)
                logger.info("Checkpoints saved")
            else:
                logger.warning("Checkpoint files cannot be accessed!")
        except Exception as ex:  # noqa: BLE001 - Caffe2 keeps training when a checkpoint cannot be written
            logger.warning("Unable to write checkpoint for epoch %s. Error=%s", epoch, ex)


def epoch_limiter(job, num_epochs) -> None:
    """Stop `job` after num_epochs epochs: a counter made in the init group, counted down each epoch."""
    with job.init_group:
        init_net = core.Net("epoch_counter_init")
        counter = init_net.CreateCounter([], init_count=num_epochs - 1)
        Task(step=init_net)
    with job.epoch_group:
        epoch_net = core.Net("epoch_countdown")
        finished = epoch_net.CountDown(counter)
        output = Task(step=epoch_net, outputs=finished).outputs()[0]
    job.add_stop_signal(output)
