"""Redis AUTH (requirepass) and TLS (rediss://) for publishing and lookups."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis

from pipeline.serving.lookup import RedisUnavailable, TopK
from pipeline.serving.publish import publish
from tests.servers import free_port_block
from tests.serving.helpers import reference_user, same_answer, user_model


def test_auth_with_requirepass(own_redis):
    redis.Redis.from_url(own_redis.url).config_set("requirepass", "s3cret-pw")
    port = own_redis.port
    with pytest.raises(redis.AuthenticationError):
        publish("m", user_model(0, n_users=5), own_redis.url)
    url = f"redis://:s3cret-pw@127.0.0.1:{port}/0"
    art = user_model(0, n_users=5)
    publish("m", art, url, top_k=5)
    with TopK(own_redis.url) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.recommend("m", 1)
    with TopK(f"redis://:wrong@127.0.0.1:{port}/0") as wrong, \
            pytest.raises(redis.AuthenticationError):
        wrong.recommend("m", 1)
    topk = TopK(url, timeout=0.3)
    assert same_answer(topk.recommend("m", 1, k=5).items, reference_user(art, 0, 5))
    own_redis.stop()
    with pytest.raises(RedisUnavailable) as err:
        topk.recommend("m", 1)
    assert "s3cret" not in str(err.value) and ":***@" in str(err.value)


def _certificates(tmp_path):
    ssl = shutil.which("openssl")
    if not ssl:
        pytest.skip("openssl not installed: cannot make test certificates")
    run = lambda *a: subprocess.run([ssl, *a], cwd=tmp_path, check=True,  # noqa: E731
                                    capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout",
        "server.key", "-out", "server.csr")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", "server.pem")
    return tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"


@pytest.mark.redis
def test_tls_with_rediss_url(tmp_path):
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server not on PATH")
    ca, cert, key = _certificates(tmp_path)
    port = free_port_block(1, offset=0)
    proc = subprocess.Popen([exe, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                             "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("this redis-server does not start with TLS")
                time.sleep(0.05)
        art = user_model(4, n_users=5)
        publish("m", art, url, top_k=5)
        with TopK(url, timeout=2.0) as topk:
            assert same_answer(topk.recommend("m", 1, k=5).items, reference_user(art, 0, 5))
        with pytest.raises(redis.ConnectionError):  # no CA given: the certificate is refused
            redis.Redis.from_url(f"rediss://127.0.0.1:{port}/0").ping()
    finally:
        proc.terminate()
        proc.wait(10)
