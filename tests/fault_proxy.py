"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the GCS emulator (tests only; standard
library, and `cryptography`, google-auth's, for one test certificate). Every client the library
uses talks to it through `proxy.env`: gcsfs, google-cloud-storage and TensorStore as to the
emulator (gcs_emulator.env of its port), and TensorFlow's GCS file system (tf.data's reads of a
tfds dataset on gs://), which knows no emulator, as an HTTPS proxy (`https_proxy`): its TLS to
www.googleapis.com / storage.googleapis.com ends here, with a certificate `CURL_CA_BUNDLE`
trusts. It forwards each request to the emulator, or fails it as the rules in force say:

  with gcs_emulator.serve() as upstream, fault_proxy.serve(upstream) as proxy:
    os.environ.update(proxy.env)
    proxy.fail(503, fraction=0.2)                              # from now on, 1 request in 5
    proxy.fail(403, prefix='gs://bucket/run/checkpoints/')     # every request to those objects
    proxy.fail('drop', prefix=..., after=10)                   # after 10 more of them pass
    proxy.clear()                                              # forward everything again

A fault is an HTTP status (403, 429, 503: a JSON error body as GCS sends), 'drop' (the
connection closed before forwarding), 'lost' (forwarded, then the connection closed: the
change is made, the answer lost) or 'slow' (forwarded after `delay` seconds). A rule applies
to requests naming an object under `prefix` (in the URL, the `name` / `prefix` parameter, an
upload's JSON metadata, or the upload session it started), `fraction` of them at random
(seeded), from the moment `fail` is called, after `after` of them have passed. The first
matching rule of those in force applies. `counts` says what was forwarded and failed.
"""
import collections
import contextlib
import datetime
import http.client
import http.server
import json
import os
import random
import re
import socket
import ssl
import tempfile
import threading
import urllib.parse

import gcs_emulator
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HOP_BY_HOP = {'connection', 'keep-alive', 'transfer-encoding', 'content-length',
              'proxy-connection', 'te', 'upgrade', 'trailer'}
REASONS = {403: 'Forbidden', 429: 'Too Many Requests', 503: 'Service Unavailable'}
GCS_HOSTS = ('www.googleapis.com', 'storage.googleapis.com')   # TensorFlow's, fixed in its code


class Rule:
  def __init__(self, fault, prefix, fraction, after, delay):
    if fault not in (*REASONS, 'drop', 'lost', 'slow'):
      raise ValueError(f'fault {fault!r}; expected one of {[*REASONS, "drop", "lost", "slow"]}')
    bucket, _, objects = prefix.removeprefix('gs://').partition('/')
    self.fault, self.bucket, self.objects = fault, bucket, objects
    self.fraction, self.after, self.delay = fraction, after, delay

  def matches(self, names: list) -> bool:
    """True for a request naming an object of `names` ((bucket, object) pairs) under the
    prefix; a rule without a prefix matches every request."""
    return not self.bucket or any(b == self.bucket and o.startswith(self.objects)
                                  for b, o in names)


def object_names(method: str, target: str, body: bytes, sessions: dict) -> list:
  """(bucket, object name or listing prefix) pairs a GCS JSON / XML API request names."""
  url = urllib.parse.urlsplit(target)
  query = urllib.parse.parse_qs(url.query)
  names = []
  found = re.search(r'/b/([^/]+)/o(?:/([^/]+))?', url.path)
  if found:
    bucket = urllib.parse.unquote(found.group(1))
    if found.group(2):
      names.append((bucket, urllib.parse.unquote(found.group(2))))
    for key in ('name', 'prefix'):
      names += [(bucket, v) for v in query.get(key, [])]
    if method in ('POST', 'PUT') and body:   # multipart or resumable upload metadata
      text = body[:65536].decode('utf-8', 'replace')
      names += [(bucket, json.loads(f'"{n}"'))
                for n in re.findall(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', text)]
    names += [sessions[u] for u in query.get('upload_id', []) if u in sessions]
  elif not url.path.startswith(('/storage/', '/upload/', '/download/', '/batch/')):
    bucket, _, name = urllib.parse.unquote(url.path).lstrip('/').partition('/')
    names.append((bucket, name))                                   # the XML API
  if url.path.startswith('/batch/') and body:   # each part names its own object
    for part in re.findall(rb'/b/[^/ ]+/o/[^ ?]+', body):
      names += object_names('GET', part.decode(), b'', sessions)
  return names


class FaultProxy:
  """The proxy's rules and counts; `serve` runs it."""

  def __init__(self, upstream_port: int, seed: int = 0, ca_file: str = '',
               tls: ssl.SSLContext | None = None):
    self.upstream_port, self.port = upstream_port, None
    self.ca_file, self.tls = ca_file, tls
    self.rules, self.lock, self.random = [], threading.Lock(), random.Random(seed)
    self.counts = collections.Counter()   # 'forwarded', 'failed', and per fault
    self.sessions = {}                    # upload_id -> the (bucket, name) it uploads

  @property
  def env(self) -> dict:
    return dict(gcs_emulator.env(self.port), https_proxy=f'http://127.0.0.1:{self.port}',
                CURL_CA_BUNDLE=self.ca_file)

  def fail(self, fault, *, prefix: str = '', fraction: float = 1.0, after: int = 0,
           delay: float = 0.0) -> None:
    with self.lock:
      self.rules.append(Rule(fault, prefix, fraction, after, delay))

  def clear(self) -> None:
    with self.lock:
      self.rules.clear()

  def decide(self, names: list):
    """The fault for a request naming `names` (None: forward it), counted."""
    with self.lock:
      for rule in self.rules:
        if not rule.matches(names):
          continue
        if rule.after > 0:
          rule.after -= 1
          break
        if self.random.random() < rule.fraction:
          self.counts['failed'] += 1
          self.counts[rule.fault] += 1
          return rule
        break
      self.counts['forwarded'] += 1
      return None


def _handler(proxy: FaultProxy):
  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):
      del args

    def _body(self) -> bytes:
      if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
        out = b''
        while True:
          size = int(self.rfile.readline().split(b';')[0], 16)
          chunk = self.rfile.read(size + 2)[:size]
          if not size:
            while self.rfile.readline() not in (b'\r\n', b'\n', b''):
              pass
            return out
          out += chunk
      return self.rfile.read(int(self.headers.get('Content-Length', 0)))

    def do_CONNECT(self):
      """An HTTPS client's tunnel (TensorFlow's): TLS ends here; the requests inside it are
      forwarded to the emulator as the others are."""
      self.send_response(200, 'Connection established')
      self.end_headers()
      self.connection = proxy.tls.wrap_socket(self.connection, server_side=True)
      self.rfile = self.connection.makefile('rb')
      self.wfile = self.connection.makefile('wb', buffering=0)
      self.close_connection = False

    def _drop(self):
      self.close_connection = True
      with contextlib.suppress(OSError):
        self.connection.shutdown(socket.SHUT_RDWR)

    def _handle(self):
      body = self._body()
      rule = proxy.decide(object_names(self.command, self.path, body, proxy.sessions))
      fault = rule.fault if rule else None
      if fault in REASONS:
        message = json.dumps({'error': {'code': fault, 'message': f'fault_proxy: {fault} '
                                        f'{REASONS[fault]}', 'errors': []}}).encode()
        self.send_response(fault)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(message)))
        self.end_headers()
        self.wfile.write(message)
        return
      if fault == 'drop':
        self._drop()
        return
      if fault == 'slow':
        threading.Event().wait(rule.delay)
      upstream = http.client.HTTPConnection('127.0.0.1', proxy.upstream_port, timeout=60)
      headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
      headers['Content-Length'] = str(len(body))
      try:
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
      finally:
        upstream.close()
      if fault == 'lost':
        self._drop()
        return
      ours, theirs = f'127.0.0.1:{proxy.port}', f'127.0.0.1:{proxy.upstream_port}'
      location = answer.getheader('Location', '')
      session = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query).get('upload_id')
      if session:   # later requests of this resumable upload name only the session
        names = object_names(self.command, self.path, body, proxy.sessions)
        if names:
          proxy.sessions[session[0]] = names[-1]
      if 'json' in answer.getheader('Content-Type', ''):
        data = data.replace(theirs.encode(), ours.encode())
      self.send_response(answer.status, answer.reason)
      for key, value in answer.getheaders():
        if key.lower() not in HOP_BY_HOP:
          self.send_header(key, value.replace(theirs, ours))
      self.send_header('Content-Length', str(len(data)))
      self.end_headers()
      if self.command != 'HEAD':
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

  return Handler


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def handle_error(self, request, client_address):
    del request, client_address   # a client that gave up on an answer (a slow one): expected


def _certificates(folder: str) -> tuple:
  """(the file of a CA made for this proxy, a TLS server context with a certificate it signed
  for GCS_HOSTS): what an HTTPS client trusts through CURL_CA_BUNDLE."""
  now = datetime.datetime.now(datetime.UTC)

  def certificate(subject, key, issuer, issuer_key, *extensions):
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=7)))
    for extension, critical in extensions:
      builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())

  ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'fault_proxy test CA')])
  ca = certificate(ca_name, ca_key, ca_name, ca_key,
                   (x509.BasicConstraints(ca=True, path_length=None), True),
                   (x509.KeyUsage(digital_signature=True, content_commitment=False,
                                  key_encipherment=False, data_encipherment=False,
                                  key_agreement=False, key_cert_sign=True, crl_sign=True,
                                  encipher_only=False, decipher_only=False), True),
                   (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False))
  server = certificate(
      x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GCS_HOSTS[0])]), key, ca_name, ca_key,
      (x509.SubjectAlternativeName([x509.DNSName(h) for h in GCS_HOSTS]), False),
      (x509.BasicConstraints(ca=False, path_length=None), True),
      (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
      (x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False))
  pem = serialization.Encoding.PEM
  ca_file, server_file = os.path.join(folder, 'ca.pem'), os.path.join(folder, 'server.pem')
  with open(ca_file, 'wb') as f:
    f.write(ca.public_bytes(pem))
  with open(server_file, 'wb') as f:
    f.write(server.public_bytes(pem) + key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  context.load_cert_chain(server_file)
  return ca_file, context


@contextlib.contextmanager
def serve(upstream_env: dict, seed: int = 0):
  """A FaultProxy on a free port of 127.0.0.1 in front of the emulator whose environment is
  `upstream_env` (gcs_emulator.serve's); forwards everything until told to fail."""
  with tempfile.TemporaryDirectory(prefix='fault_proxy') as folder:
    proxy = FaultProxy(int(upstream_env['STORAGE_EMULATOR_HOST'].rsplit(':', 1)[1]), seed,
                       *_certificates(folder))
    server = _Server(('127.0.0.1', 0), _handler(proxy))
    proxy.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name='fault_proxy', daemon=True)
    thread.start()
    try:
      yield proxy
    finally:
      server.shutdown()
      server.server_close()
