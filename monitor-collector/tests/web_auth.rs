//! The HTTP API lets in only who may (issue 24): a real `railscope-collector` with a web
//! config in Prometheus' exporter-toolkit format, its TLS certificates made by the test (its
//! own CA, a server and a client certificate, rcgen) and its users' bcrypt hashes made by
//! the test; asked with Debian's curl and Debian's headless Chromium, as an operator would:
//! - without credentials, the page and every route of the route table answer 401 with
//!   `WWW-Authenticate: Basic realm="railscope"`; a wrong password too;
//! - a `read` user gets every read route and 403 on `POST /-/reload`; an `admin` reloads;
//!   the refusals are counted on `/metrics/collector`;
//! - an `admin` finds every route of the table (`monitor_collector::routes::ROUTES`) served
//!   with its method, and no path outside it;
//! - the dashboard opens over HTTPS in Chromium (trusting the test's server key for that
//!   run only), the user answering the browser's basic-auth prompt, and draws the fleet;
//! - a new password in the file works after SIGHUP, without a restart, and the old one no
//!   longer does; a broken file on `POST /-/reload` is refused (500) and the config kept;
//! - with `client_auth_type: RequireAndVerifyClientCert`, curl without a client certificate
//!   (or with one of another CA) fails the handshake, and with the CA's succeeds;
//! - on a non-loopback address without authentication the collector refuses to start,
//!   unless told `--web.allow-unauthenticated`.

mod browser;

use std::{
    ffi::OsStr,
    net::{SocketAddr, TcpListener, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use base64::Engine as _;
use browser::{Page, assert_no_problem, chromium, eval, wait_until};
use monitor_collector::{
    routes::{Method, ROUTES},
    web::Role,
};
use monitor_testkit::SimulatedFleet;
use monitor_wire::Key;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData as _, SanType,
};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY: [u8; 32] = [0x3c; 32];
const NODES: usize = 4;

fn free_port() -> u16 {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    UdpSocket::bind(("127.0.0.1", port)).map_or_else(|_| free_port(), |_| port)
}

/// The test's own CA, a server certificate for 127.0.0.1 and localhost (server.pem,
/// server.key), a client certificate, all signed by it; and a client certificate of another
/// CA.
struct Pki {
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    stranger_cert: PathBuf,
    stranger_key: PathBuf,
    /// base64 of the SHA-256 of the server key's SubjectPublicKeyInfo (what Chromium's
    /// `--ignore-certificate-errors-spki-list` takes).
    server_spki_sha256: String,
}

fn ca(name: &str) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params, key)
}

fn make_pki(dir: &Path) -> Pki {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (ca_params, ca_key) = ca("railscope test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    params
        .distinguished_name
        .push(DnType::CommonName, "railscope collector");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = params.signed_by(&server_key, &issuer).unwrap();

    let client_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "ops");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = params.signed_by(&client_key, &issuer).unwrap();

    let (other_params, other_key) = ca("another CA");
    let other = Issuer::new(other_params, other_key);
    let stranger_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "stranger");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let stranger_cert = params.signed_by(&stranger_key, &other).unwrap();

    write("server.pem", server_cert.pem());
    write("server.key", server_key.serialize_pem());
    let spki = server_key.subject_public_key_info();
    let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
    Pki {
        ca: write("ca.pem", ca_cert.pem()),
        client_cert: write("client.pem", client_cert.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
        stranger_cert: write("stranger.pem", stranger_cert.pem()),
        stranger_key: write("stranger.key", stranger_key.serialize_pem()),
        server_spki_sha256: base64::engine::general_purpose::STANDARD.encode(digest.as_ref()),
    }
}

/// A bcrypt hash at cost 4 (the lowest: the test checks many passwords).
fn hash(password: &str) -> String {
    bcrypt::hash(password, 4).unwrap()
}

/// The collector binary, killed on drop.
struct RunningCollector {
    child: Child,
    udp: SocketAddr,
    http: SocketAddr,
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

/// The arguments of `railscope-collector run` on loopback ports with a scratch archive, and
/// an `[actions]` table (a dry run without rules), so that every route of the table is served.
fn collector_command(dir: &Path, udp: SocketAddr, http: SocketAddr) -> Command {
    let config = dir.join("collector.toml");
    std::fs::write(&config, "[actions]\n").unwrap();
    let key = dir.join("wire.key");
    std::fs::write(&key, KEY).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut command = Command::new(COLLECTOR);
    command
        .args([
            OsStr::new("run"),
            OsStr::new("--listen"),
            OsStr::new(&udp.to_string()),
            OsStr::new("--http"),
            OsStr::new(&http.to_string()),
            OsStr::new("--key"),
            key.as_os_str(),
            OsStr::new("--data"),
            dir.join("data").as_os_str(),
            OsStr::new("--config"),
            config.as_os_str(),
        ])
        .env("RAILSCOPE_LOG", "info")
        .stdout(Stdio::null());
    command
}

impl RunningCollector {
    /// Started with `web_config` (written to web.yml in `dir`, where the certificates are).
    fn start(dir: tempfile::TempDir, pki: &Pki, web_config: &str, client: &[&OsStr]) -> Self {
        let web = dir.path().join("web.yml");
        std::fs::write(&web, web_config).unwrap();
        let udp: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = collector_command(dir.path(), udp, http)
            .arg("--web.config.file")
            .arg(&web)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting railscope-collector");
        let running = Self {
            child,
            udp,
            http,
            ca: pki.ca.clone(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while running.curl("GET", "/metrics/collector", None, client).0 != 0 {
            assert!(
                Instant::now() < deadline,
                "the collector never answered HTTPS"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        running
    }

    fn web_config(&self) -> PathBuf {
        self._dir.path().join("web.yml")
    }

    /// curl's exit code, the HTTP status (0 when there was no answer), headers and body.
    fn curl(
        &self,
        method: &str,
        path: &str,
        user: Option<(&str, &str)>,
        more: &[&OsStr],
    ) -> (i32, u16, String) {
        let mut command = Command::new("curl");
        command
            .args(["-s", "-i", "--max-time", "20", "-X", method, "--cacert"])
            .arg(&self.ca)
            .args(more);
        if let Some((user, password)) = user {
            command.args(["-u", &format!("{user}:{password}")]);
        }
        let Output { status, stdout, .. } = command
            .arg(format!("https://{}{path}", self.http))
            .output()
            .expect("running curl");
        let text = String::from_utf8_lossy(&stdout).into_owned();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status.code().unwrap_or(-1), code, text)
    }

    fn status(&self, method: &str, path: &str, user: Option<(&str, &str)>) -> u16 {
        self.curl(method, path, user, &[]).1
    }
}

impl Drop for RunningCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A route's path as asked for: `{node}` and the like given a value.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|part| {
            if part.starts_with('{') {
                "gpu-node-000"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn counter(metrics: &str, line_start: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in {metrics}"))
}

const BOB: (&str, &str) = ("bob", "bob's password");
const ALICE: (&str, &str) = ("alice", "alice's password");

fn web_config(bob_password: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n\
         basic_auth_users:\n  alice: {}\n  bob: {}\n\
         railscope_roles:\n  alice: admin\n",
        hash(ALICE.1),
        hash(bob_password)
    )
}

#[test]
fn only_users_of_the_web_config_get_in_each_with_their_role() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let collector = RunningCollector::start(dir, &pki, &web_config(BOB.1), &[]);
    assert!(ROUTES.len() >= 17, "{}", ROUTES.len());
    assert!(
        ROUTES
            .iter()
            .any(|r| (r.method, r.path, r.role) == (Method::Post, "/-/reload", Role::Admin))
    );

    // No credentials: 401 everywhere, with the browser's prompt asked for.
    for route in ROUTES {
        let (method, path) = (route.method.as_str(), concrete(route.path));
        assert_eq!(
            collector.status(method, &path, None),
            401,
            "{method} {path} without credentials"
        );
    }
    let (_, code, text) = collector.curl("GET", "/", None, &[]);
    assert_eq!(code, 401);
    assert!(
        text.to_ascii_lowercase()
            .contains("www-authenticate: basic realm=\"railscope\""),
        "{text}"
    );
    assert_eq!(collector.status("GET", "/nowhere", None), 401);
    assert_eq!(
        collector.status("GET", "/", Some(("bob", "not bob's password"))),
        401
    );
    assert_eq!(
        collector.status("GET", "/", Some(("mallory", "bob's password"))),
        401
    );

    // A read user: every read route, not the admin ones.
    for route in ROUTES {
        let (method, path) = (route.method.as_str(), concrete(route.path));
        let code = collector.status(method, &path, Some(BOB));
        if route.role == Role::Read {
            // Some query routes ask for parameters (400 without): still past the door.
            assert!(
                code != 401 && code != 403 && code < 500,
                "{method} {path} as bob: {code}"
            );
        } else {
            assert_eq!(code, 403, "{method} {path} as bob");
        }
    }
    for path in [
        "/",
        "/ui/app.js",
        "/metrics",
        "/metrics/collector",
        "/api/v1/live/nodes",
        "/api/v1/findings",
    ] {
        assert_eq!(collector.status("GET", path, Some(BOB)), 200, "GET {path}");
    }
    // The admin reloads.
    let (_, code, text) = collector.curl("POST", "/-/reload", Some(ALICE), &[]);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("web config reloaded from"), "{text}");
    assert_eq!(collector.status("GET", "/api/v1/nodes", Some(ALICE)), 200);
    let (_, code, text) = collector.curl("POST", "/api/v1/actions/release", Some(ALICE), &[]);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains(r#"{"released":[]}"#), "{text}");

    let (_, _, metrics) = collector.curl("GET", "/metrics/collector", Some(BOB), &[]);
    assert!(
        counter(
            &metrics,
            "railscope_collector_http_refused_total{reason=\"unauthenticated\"}"
        ) >= ROUTES.len() as u64 + 4,
        "{metrics}"
    );
    // Bob's one try of each admin route.
    let admin_routes = ROUTES.iter().filter(|r| r.role == Role::Admin).count();
    assert!(admin_routes >= 2, "{admin_routes}");
    assert_eq!(
        counter(
            &metrics,
            "railscope_collector_http_refused_total{reason=\"forbidden\"}"
        ),
        admin_routes as u64
    );

    // The dashboard, in a browser, over HTTPS, behind the prompt.
    if let Some(chromium) = chromium() {
        let mut fleet = SimulatedFleet::builder(NODES)
            .job("slurm:77", 0..NODES)
            .ticks_before_now(20)
            .build(Key::from_bytes(KEY));
        fleet.send_ticks(collector.udp, 20).unwrap();
        let spki = format!(
            "--ignore-certificate-errors-spki-list={}",
            pki.server_spki_sha256
        );
        let page = Page::open_with(
            chromium,
            &format!("https://{}/?refresh=1#/fleet", collector.http),
            &[&spki],
            Some(BOB),
        );
        let (tab, problems) = (&*page.tab, &*page.problems);
        wait_until(
            tab,
            "the fleet grid",
            "return window.railscope.updates >= 1 && !!document.querySelector('#fleet-grid .grid')",
        );
        let cells = eval(
            tab,
            "return [location.protocol, document.querySelectorAll('.cell.gpu').length, \
                     document.querySelector('.grid').dataset.nodes]",
        );
        assert_eq!(
            cells,
            serde_json::json!(["https:", NODES * 8, NODES.to_string()])
        );
        assert_no_problem(
            tab,
            problems,
            "opening the fleet view over HTTPS with basic auth",
        );
    }

    // A new password for bob, read on SIGHUP: no restart.
    let new_bob = ("bob", "bob's new password");
    std::fs::write(collector.web_config(), web_config(new_bob.1)).unwrap();
    assert_eq!(
        collector.status("GET", "/", Some(new_bob)),
        401,
        "before SIGHUP"
    );
    assert_eq!(
        unsafe { libc::kill(collector.child.id() as i32, libc::SIGHUP) },
        0
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while collector.status("GET", "/", Some(new_bob)) != 200 {
        assert!(Instant::now() < deadline, "the new password never worked");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        collector.status("GET", "/", Some(BOB)),
        401,
        "the old password"
    );

    // A broken file is refused, naming itself; the config in effect stays.
    std::fs::write(
        collector.web_config(),
        "basic_auth_users:\n  alice: not-a-hash\n",
    )
    .unwrap();
    let (_, code, text) = collector.curl("POST", "/-/reload", Some(ALICE), &[]);
    assert_eq!(code, 500, "{text}");
    assert!(
        text.contains("web.yml: basic_auth_users.alice: not a bcrypt hash"),
        "{text}"
    );
    assert_eq!(collector.status("GET", "/", Some(new_bob)), 200);
    assert_eq!(collector.status("POST", "/-/reload", Some(new_bob)), 403);
}

/// The collector, with every source a route answers from (the archive, the findings, the
/// actions), serves each route of the table with the table's method and no path outside it:
/// to an admin, a routed path asked with a method it does not answer gets 405, a path that
/// is not routed 404.
#[test]
fn the_collector_serves_the_route_table_and_no_other_path() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let collector = RunningCollector::start(dir, &pki, &web_config(BOB.1), &[]);
    for route in ROUTES {
        let (method, path) = (route.method.as_str(), concrete(route.path));
        // Some routes ask for parameters (400 without), the hardware path a known node (404
        // from its handler): still routed.
        let code = collector.status(method, &path, Some(ALICE));
        assert!(
            ![401, 403, 405].contains(&code) && code < 500,
            "{method} {path} as alice: {code}"
        );
        assert_eq!(
            collector.status("DELETE", &path, Some(ALICE)),
            405,
            "DELETE {path}: {path} is not routed"
        );
    }
    for path in [
        "/nowhere",
        "/ui/",
        "/ui/nowhere.js",
        "/metrics/nowhere",
        "/api/v1",
        "/api/v1/live",
        "/api/v1/nowhere",
        "/api/v1/nodes/gpu-node-000",
        "/api/v1/actions/nowhere",
        "/-/healthy",
    ] {
        assert!(ROUTES.iter().all(|r| concrete(r.path) != path), "{path}");
        for method in ["GET", "POST", "DELETE"] {
            assert_eq!(
                collector.status(method, path, Some(ALICE)),
                404,
                "{method} {path} as alice"
            );
        }
    }
}

#[test]
fn client_certificates_are_verified_when_the_config_requires_them() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let with_cert = [
        OsStr::new("--cert"),
        pki.client_cert.as_os_str(),
        OsStr::new("--key"),
        pki.client_key.as_os_str(),
    ];
    let config = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
                  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n";
    let collector = RunningCollector::start(dir, &pki, config, &with_cert);

    let (exit, code, text) = collector.curl("GET", "/metrics/collector", None, &[]);
    assert!(
        exit != 0 && code == 0,
        "no client certificate: curl {exit}, {code}: {text}"
    );
    let stranger = [
        OsStr::new("--cert"),
        pki.stranger_cert.as_os_str(),
        OsStr::new("--key"),
        pki.stranger_key.as_os_str(),
    ];
    let (exit, code, text) = collector.curl("GET", "/metrics/collector", None, &stranger);
    assert!(
        exit != 0 && code == 0,
        "another CA's certificate: curl {exit}, {code}: {text}"
    );
    let (exit, code, text) = collector.curl("GET", "/metrics/collector", None, &with_cert);
    assert_eq!((exit, code), (0, 200), "{text}");
    assert!(text.contains("railscope_collector_http_refused_total"));
    let (_, code, _) = collector.curl("GET", "/api/v1/live/nodes", None, &with_cert);
    assert_eq!(code, 200);
}

#[test]
fn a_non_loopback_address_without_authentication_needs_the_operators_word() {
    let dir = tempfile::tempdir().unwrap();
    let udp: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http: SocketAddr = format!("0.0.0.0:{}", free_port()).parse().unwrap();
    let out = collector_command(dir.path(), udp, http)
        // The line as an operator sees it (no backtrace asked for).
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("is not a loopback address")
            && stderr.contains("--web.allow-unauthenticated")
            && stderr.contains(&http.to_string()),
        "{stderr}"
    );

    let mut child = collector_command(dir.path(), udp, http)
        .arg("--web.allow-unauthenticated")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let local: SocketAddr = format!("127.0.0.1:{}", http.port()).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        if let Ok(mut answer) = ureq::get(&format!("http://{local}/metrics/collector")).call() {
            break answer.body_mut().read_to_string().unwrap();
        }
        assert!(Instant::now() < deadline, "never answered");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answer.contains("railscope_collector_http_refused_total"));
    let _ = child.kill();
    let _ = child.wait();
}

/// The command-line clients reach an API behind TLS and basic auth through the HTTP client
/// file of Prometheus' tools (`RAILSCOPE_HTTP_CONFIG_FILE`); without it they are refused, and
/// say why.
#[test]
fn command_line_clients_use_the_http_client_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let client_dir = tempfile::tempdir().unwrap();
    let collector = RunningCollector::start(dir, &pki, &web_config(BOB.1), &[]);
    let url = format!("https://{}", collector.http);
    let password = client_dir.path().join("password");
    std::fs::write(&password, format!("{}\n", BOB.1)).unwrap();
    let config = client_dir.path().join("http.yml");
    std::fs::write(
        &config,
        format!(
            "basic_auth:\n  username: {}\n  password_file: {}\ntls_config:\n  ca_file: {}\n",
            BOB.0,
            password.display(),
            pki.ca.display()
        ),
    )
    .unwrap();
    let run = |env: Option<&Path>, args: &[&str]| {
        let mut command = Command::new(COLLECTOR);
        command.args(args).env_remove("RAILSCOPE_HTTP_CONFIG_FILE");
        if let Some(file) = env {
            command.env("RAILSCOPE_HTTP_CONFIG_FILE", file);
        }
        let out = command.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let findings = ["findings", "--collector", url.as_str(), "--json"];
    let nodes = ["query", "--collector", url.as_str(), "--json", "nodes"];
    for args in [&findings[..], &nodes[..]] {
        let (ok, stdout, stderr) = run(Some(&config), args);
        assert!(ok, "{args:?}: {stderr}");
        assert!(
            serde_json::from_str::<serde_json::Value>(&stdout).is_ok(),
            "{stdout}"
        );
    }
    // Without the file: the system's roots do not know the test CA.
    let (ok, _, stderr) = run(None, &nodes);
    assert!(!ok && stderr.contains(&url), "{stderr}");
    // A wrong password: the collector's 401, said as such.
    std::fs::write(&password, "not bob's password\n").unwrap();
    let (ok, _, stderr) = run(Some(&config), &nodes);
    assert!(!ok && stderr.contains("401"), "{stderr}");
    // A file the clients cannot use is named.
    std::fs::write(&config, "basic_auth: [\n").unwrap();
    let (ok, _, stderr) = run(Some(&config), &nodes);
    assert!(
        !ok && stderr.contains("RAILSCOPE_HTTP_CONFIG_FILE") && stderr.contains("http.yml"),
        "{stderr}"
    );
}
