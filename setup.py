"""Build hook: compile the schemas under proto/ (caffe2.proto, hsm.proto, caffe.proto) into
stepnet/<name>_pb2.py with grpcio-tools."""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTOS = ("caffe2.proto", "hsm.proto", "caffe.proto")


def compile_proto(out_dir: Path) -> None:
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in PROTOS:
        rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--python_out={out_dir}", str(ROOT / "proto" / name)])
        if rc != 0:
            raise RuntimeError(f"protoc failed on proto/{name} (exit {rc})")


class BuildPyWithProto(build_py):
    def run(self):
        super().run()
        # Editable installs import from the source tree; regular builds from build_lib.
        compile_proto(ROOT / "stepnet" if self.editable_mode else Path(self.build_lib) / "stepnet")


setup(cmdclass={"build_py": BuildPyWithProto})
