"""compat.checkpoint and the GetAllBlobNames op: a job counting epochs run by JobRunner with checkpoint managers,
the db files it writes (names as Caffe2's db_name makes them) and the values they hold, worked out by hand;
resuming, loading single blobs, a failed save that does not stop the job."""
import logging
import os

import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.checkpoint import (CheckpointManager, Job, JobRunner, MultiNodeCheckpointManager, db_name,
                                       epoch_limiter, get_ckpt_filename)
from stepnet.compat.session import LocalSession
from stepnet.compat.task import Node, Task


def test_db_names():
    assert get_ckpt_filename("trainer_3", 7) == "trainer_3.7"
    assert db_name(7, "trainer_3", "/ckpt") == "/ckpt/trainer_3.7"
    assert db_name(7, "trainer_3", "/ckpt", path_prefix="hdfs://x/") == "hdfs://x/trainer_3.7"


def test_get_all_blob_names_local_and_shared():
    workspace.FeedBlob("outer", np.zeros(1, np.float32))
    inner = core.Net("inner")
    inner.ConstantFill([], "made_inside", shape=[1])
    inner.GetAllBlobNames([], "local_names", include_shared=False)
    inner.GetAllBlobNames([], "all_names")
    inner.Copy("local_names", "outer_copy_local")   # outer_* names exist in the parent after the step
    inner.Copy("all_names", "outer_copy_all")
    workspace.FeedBlob("outer_copy_local", np.zeros(1, np.float32))
    workspace.FeedBlob("outer_copy_all", np.zeros(1, np.float32))
    step = core.execution_step("child", inner)
    step.SetCreateWorkspace(True)
    plan = core.Plan("p")
    plan.AddStep(step)
    workspace.RunPlan(plan)
    local = [b.decode() for b in workspace.FetchBlob("outer_copy_local").tolist()]
    every = [b.decode() for b in workspace.FetchBlob("outer_copy_all").tolist()]
    assert local == ["all_names", "local_names", "made_inside"]
    assert every == ["all_names", "local_names", "made_inside", "outer", "outer_copy_all", "outer_copy_local"]


def counting_job(num_epochs):
    """A job whose init group makes total = 100 and whose epochs add 1, 2, 3, ... to it (the epoch number from
    a counter); stops after num_epochs epochs."""
    with Job() as job:
        with Node("trainer_0"):
            with job.init_group:
                init = core.Net("count_init")
                init.ConstantFill([], "total", shape=[1], value=100, dtype=core.DataType.INT64)
                init.CreateCounter([], "epochs", init_count=0)
                Task(step=init)
            epoch = core.Net("count_epoch")
            n = epoch.CountUp("epochs")
            epoch.Add(["total", epoch.Add([n, epoch.ConstantFill([], shape=[], value=1,
                                                                  dtype=core.DataType.INT64)])],
                      "total", broadcast=1)
            Task(step=epoch)
            epoch_limiter(job, num_epochs)
    return job


def totals_after(epoch):
    return 100 + sum(range(1, epoch + 1))


def load_total(session, manager, epoch, ws):
    session.run(manager.load(epoch))
    return ws.blobs["total"].fetch().tolist()


def test_job_runner_saves_each_epoch_and_resumes(tmp_path):
    ws = workspace.C.Workspace()
    session = LocalSession(ws)
    manager = CheckpointManager(str(tmp_path), "trainer_0", "minidb")
    job = counting_job(3)
    assert JobRunner(job, manager)(session) == 3
    assert ws.blobs["total"].fetch().tolist() == [totals_after(3)]
    assert sorted(os.listdir(tmp_path)) == [f"trainer_0.{e}" for e in range(4)]
    assert "blob_names" in manager.blob_list() and "total" in manager.blob_list()
    for epoch in range(4):
        assert load_total(session, manager, epoch, ws) == [totals_after(epoch)]

    # resume from epoch 1 in a fresh workspace: the init group is not run, the checkpoint is loaded instead
    ws2 = workspace.C.Workspace()
    session2 = LocalSession(ws2)
    manager2 = CheckpointManager(str(tmp_path), "trainer_0", "minidb")
    assert JobRunner(job, manager2, resume_from_epoch=1)(session2) == 3
    assert ws2.blobs["total"].fetch().tolist() == [totals_after(3)]


def test_load_blobs_from_checkpoints(tmp_path):
    ws = workspace.C.Workspace()
    job = counting_job(2)
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "minidb"))
    runner(LocalSession(ws))
    fresh = workspace.C.Workspace()
    loader = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "minidb"))
    assert loader.load_blobs_from_checkpoints(["total", "missing"], epoch=1, session=LocalSession(fresh))
    assert fresh.fetch_blob("total").tolist() == [totals_after(1)]
    assert not loader.load_blobs_from_checkpoints(["total"], epoch=9, session=LocalSession(fresh))
    assert runner.checkpoint_manager.get_ckpt_db_name("trainer_0", 2) == str(tmp_path / "trainer_0.2")


def test_a_failed_save_is_logged_and_the_job_goes_on(tmp_path, caplog):
    ws = workspace.C.Workspace()
    manager = CheckpointManager(str(tmp_path / "no" / "such" / "dir"), "trainer_0", "minidb")
    with caplog.at_level(logging.WARNING, logger="stepnet.compat.checkpoint"):
        assert JobRunner(counting_job(2), manager)(LocalSession(ws)) == 2
    assert caplog.text.count("Unable to write checkpoint for epoch") == 3
    assert ws.blobs["total"].fetch().tolist() == [totals_after(2)]


def test_checkpoint_manager_is_for_one_node():
    with pytest.raises(AssertionError, match="single node"):
        CheckpointManager("/tmp", "a", "minidb").init(nodes=["a", "b"])


def test_job_runner_without_manager_cannot_load():
    with pytest.raises(ValueError, match="Checkpoint manager is None"):
        JobRunner(Job()).load_blobs_from_checkpoints(["x"], 1, None)
