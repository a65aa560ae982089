"""tomlconf: extends, overrides and tuples as both entry points rely on them (their own loaders'
tests cover the messages users see); the one section base, logging section and error formatter."""

import pytest
from pydantic import ValidationError

import tomlconf
from tomlconf import ConfigError, LoggingConfig, Section, describe_errors


def test_a_file_extends_another_and_sets_only_what_differs(tmp_path):
    (tmp_path / "base.toml").write_text('[queue]\nurl = "http://a"\ntimeout_s = 5\n[model]\nname = "x"\n')
    (tmp_path / "top.toml").write_text('extends = "base.toml"\n[queue]\ntimeout_s = 9\n')
    assert tomlconf.read(tmp_path / "top.toml") == {"queue": {"url": "http://a", "timeout_s": 9},
                                                    "model": {"name": "x"}}


def test_overrides_are_toml_values_or_bare_words_and_make_sections():
    raw = {"api": {"poll_s": 5.0}}
    assert tomlconf.override(raw, "api.poll_s=2") == "api.poll_s"
    tomlconf.override(raw, "database.url=postgresql://dit@db/dit")
    tomlconf.override(raw, "api.webhook_allow=['a', 'b']")
    assert raw == {"api": {"poll_s": 2, "webhook_allow": ["a", "b"]}, "database": {"url": "postgresql://dit@db/dit"}}
    assert tomlconf.tuples(raw)["api"]["webhook_allow"] == ("a", "b")


@pytest.mark.parametrize("text, message", [
    ('extends = "top.toml"\n', "extends: top.toml extends itself"),
    ("extends = 3\n", "extends: expected a file name"),
    ("[queue\n", "not valid TOML"),
])
def test_a_file_that_cannot_be_used_is_named(tmp_path, text, message):
    (tmp_path / "top.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        tomlconf.read(tmp_path / "top.toml")


def test_an_override_that_cannot_apply_is_named():
    with pytest.raises(ConfigError, match="--set 'nothing': expected section.key=value"):
        tomlconf.override({}, "nothing")
    with pytest.raises(ConfigError, match="server.port.x: port is not a section"):
        tomlconf.override({"server": {"port": 1}}, "server.port.x=1")
    with pytest.raises(ConfigError, match="cannot read"):
        tomlconf.read(__import__("pathlib").Path("/nonexistent/x.toml"))


# ---------------------------------------------------------------- the shared section, logging and errors

class Inner(Section):
    port: int = 1


class Outer(Section):
    inner: Inner = Inner()
    logging: LoggingConfig = LoggingConfig()


def errors_of(raw: dict) -> ValidationError:
    try:
        Outer.model_validate(raw)
    except ValidationError as e:
        return e
    raise AssertionError("validated")


def test_errors_name_each_field_its_unknown_keys_and_the_flag_that_set_it():
    e = errors_of({"inner": {"port": "8700", "prot": 1}})
    assert describe_errors(e) == "inner.port: Input should be a valid integer; inner.prot: unknown key"
    assert describe_errors(e, origins={"inner.port": "--port"}).startswith(
        "inner.port: Input should be a valid integer (from --port); ")
    assert describe_errors(e, words={"extra_forbidden": "unknown field"}).endswith("inner.prot: unknown field")


def test_an_error_at_the_top_is_its_message_or_named_by_root():
    e = errors_of([])
    assert describe_errors(e).startswith("Input should be")
    assert describe_errors(e, root="input").startswith("input: Input should be")


def test_one_logging_section_in_any_case_strict_and_frozen():
    assert Outer.model_validate({"logging": {"level": "debug"}}).logging.level == "DEBUG"
    assert "logging.level" in describe_errors(errors_of({"logging": {"level": "LOUD"}}))
    assert "logging.colour: unknown key" in describe_errors(errors_of({"logging": {"colour": "red"}}))
