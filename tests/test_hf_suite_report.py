"""tools/hf_suite_report.py: counts from tools/hf_suite.sh's junit XML."""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "tools", "hf_suite_report.py")
_spec = importlib.util.spec_from_file_location("hf_suite_report", _PATH)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def test_interrupted_run_counts_only_named_cases(tmp_path):
    # pytest interrupted at the model limit (SIGINT) ends its junit XML with an empty
    # <testcase time="0.000"/>: it is no test and must not count as one passed.
    xml = tmp_path / "m-tpu.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.models.m.test_modeling_m.MTest" name="test_a" time="1.0"/>'
        '<testcase classname="tests.models.m.test_modeling_m.MTest" name="test_b" time="2.0">'
        '<failure message="AssertionError: no">x</failure></testcase>'
        '<testcase time="0.000"/>'
        "</testsuite></testsuites>")
    res = report.load(str(xml))
    assert res == {"MTest::test_a": ("passed", ""), "MTest::test_b": ("failed", "AssertionError: no")}
