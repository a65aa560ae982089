"""tomlconf: extends, overrides and tuples as both entry points rely on them (their own loaders'
tests cover the messages users see)."""

import pytest

import tomlconf
from tomlconf import ConfigError


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
