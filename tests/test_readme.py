"""The README stays true: its operator table and its examples."""
import re
from pathlib import Path

from stepnet.cli.run import main, op_table

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_operator_table_is_current():
    table = re.search(r"<!-- ops:begin -->\n(.*)\n<!-- ops:end -->", README, re.S).group(1)
    assert table.strip() == op_table(markdown=True).strip(), (
        "README operator table is stale: regenerate it with `stepnet ops --markdown`")


def test_example_commands(capsys):
    root = Path(__file__).resolve().parents[1]
    assert main(["run", str(root / "models/xor/init_net.pbtxt"), str(root / "models/xor/predict_net.pbtxt"),
                 "--feed", "X=[[0, 1], [1, 1]]"]) == 0
    out = capsys.readouterr().out
    assert "y: shape (2, 1) float32 [1., 0.]" in out and out.strip() in README
    assert main(["run", str(root / "models/xor/init_net.pbtxt"), str(root / "models/xor/predict_net.pbtxt"),
                 "--feed", "X=[[0, 1, 1]]"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: net 'xor_predict', op #0 (FC): FC: X (1, 3) at axis=1")
    assert err[:90] in README
