"""KV events off loopback, authenticated and encrypted: SGLang's ZMQ event publisher with ZMQ CURVE (issue 41).

`BlockStored` events carry token ids, which are users' prompts. When `k3 serve` binds the event sockets to a
reachable address (`K3_KV_EVENTS_HOST` not loopback), or when `K3_KV_EVENTS_CURVE=on`, it asks SGLang for the
publisher `k3_zmq_curve` instead of `zmq` (registered through SGLang's `EventPublisherFactory.register_publisher`,
an extension point, by our plugin in every server process): SGLang's `ZmqEventPublisher` whose PUB and replay
(ROUTER) sockets come from a private ZMQ context that makes every socket a CURVE server with the worker's key pair
(`K3_KV_EVENTS_CURVE_SECRET_FILE`, a ZMQ certificate file holding both keys, as `zmq.auth.create_certificates`
writes) and a ZAP authenticator that admits only the client public keys in `K3_KV_EVENTS_CURVE_CLIENTS_DIR`
(certificate files, one per router). A subscriber without an admitted key (or without the worker's public key)
completes no handshake and receives nothing; the router, given its own certificate and the worker's public one
(`k3 router --curve-key FILE --curve-server-key FILE`), subscribes and replays as on loopback.
SGLang's separate load publisher (per-rank request counts, no prompts) is left as SGLang binds it.
"""

from __future__ import annotations

import ipaddress
import logging

from k3_sglang.router.event_curve import CURVE_PUBLISHER, load_keys

log = logging.getLogger(__name__)
PUBLISHER = CURVE_PUBLISHER
ZAP_DOMAIN = "k3-kv-events"  # the ZAP domain of both sockets (pyzmq's authenticator keys certificates by domain)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost` (a wildcard or any other address is reachable from off the host)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def curve_publisher_class():
    """SGLang's ZmqEventPublisher with CURVE server sockets and a ZAP authenticator (SGLang imported lazily)."""
    import zmq
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher
    from zmq.auth.thread import ThreadAuthenticator

    from k3_sglang.serving.kv_events_config import KvEventsSettings

    class CurveZmqEventPublisher(ZmqEventPublisher):
        """PUB and replay sockets are CURVE servers; only the admitted client keys complete a handshake."""

        def _socket_setup(self) -> None:
            settings = KvEventsSettings.from_env()
            keys = load_keys(settings.kv_events_curve_secret_file, "K3_KV_EVENTS_CURVE_SECRET_FILE")
            if keys.secret is None:
                raise ValueError("K3_KV_EVENTS_CURVE_SECRET_FILE holds no secret key")
            context = zmq.Context()  # private: the process's shared context must not turn into a CURVE server
            self._k3_auth = ThreadAuthenticator(context)
            self._k3_auth.start()
            self._k3_auth.configure_curve(domain=ZAP_DOMAIN, location=settings.kv_events_curve_clients_dir)
            context.setsockopt(zmq.CURVE_SERVER, 1)
            context.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
            context.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
            context.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
            self._ctx = context
            log.info("KV events: CURVE on (clients admitted from %s)", settings.kv_events_curve_clients_dir)
            super()._socket_setup()

        def shutdown(self) -> None:
            super().shutdown()
            self._k3_auth.stop()

    return CurveZmqEventPublisher


def register_publisher() -> None:
    """Make `k3_zmq_curve` a publisher SGLang's `--kv-events-config` can name (once per process)."""
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory

    try:
        EventPublisherFactory.register_publisher(PUBLISHER, curve_publisher_class())
    except KeyError:
        pass  # registered already in this process
