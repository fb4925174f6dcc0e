//! The agent's local endpoint for `ebpf-proxy explain`: a unix socket
//! (`--explain-socket`, mode 0600: only root asks; never the network)
//! where the agent says, for one frontend entry of a service, every
//! endpoint the cluster has and why each is used or not
//! (`crate::model::explain`).
//!
//! One request per connection: the client writes one JSON line
//! ([`Request`]), the agent answers one JSON line ([`Answer`]) and closes.
//! The answer is made in the sync loop (`crate::agent`), which owns the
//! model's inputs: the server hands each request over a channel with a
//! oneshot for the reply, so nothing the loop uses is shared or locked.
use std::{
    io::{self, BufRead as _, BufReader, Write as _},
    net::IpAddr,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};
use tracing::{debug, info, warn};

use crate::{
    model::{
        FrontendKey, NodeContext, Protocol, Scope, SliceSpec,
        explain::{Explained, explain_entry},
    },
    source::ChangeSource,
};

/// What `ebpf-proxy explain` asks: one frontend entry of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The entry: its address, port (a nodePort for NodePort entries) and
    /// protocol (`TCP`, `UDP`, `SCTP`).
    pub(crate) address: IpAddr,
    pub(crate) port: u16,
    pub(crate) protocol: String,
    /// The `external` entry (traffic from outside, externalTrafficPolicy:
    /// Local) rather than the one every client uses.
    #[serde(default)]
    pub(crate) external: bool,
}

impl Request {
    /// The entry asked about, or why the request names none.
    fn key(&self) -> Result<FrontendKey, String> {
        let protocol = match self.protocol.to_ascii_uppercase().as_str() {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            other => return Err(format!("protocol {other:?}: expected TCP, UDP or SCTP")),
        };
        let scope = if self.external { Scope::External } else { Scope::All };
        Ok(FrontendKey { addr: self.address, port: self.port, protocol, scope })
    }
}

/// The agent's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub(crate) enum Answer {
    /// Every endpoint of the entry's service port, with its verdict.
    Explained(Explained),
    /// The agent cannot tell, and why.
    NotExplained { reason: String },
}

/// A request and where its answer goes.
pub(crate) type Asked = (Request, oneshot::Sender<Answer>);

/// The longest request line read.
const MAX_REQUEST: usize = 4096;
/// How long a client may take to send its request, and how long it waits
/// for the loop to answer (it answers between syncs).
const TIMEOUT: Duration = Duration::from_secs(30);

/// Answers `request` from `source`'s objects and the node the model last
/// translated for (`None`: nothing translated yet).
pub(crate) fn answer(request: &Request, source: &impl ChangeSource, node: Option<&NodeContext>) -> Answer {
    let not = |reason: String| Answer::NotExplained { reason };
    let key = match request.key() {
        Ok(key) => key,
        Err(reason) => return not(reason),
    };
    let Some(node) = node else {
        return not("the agent has not translated its first table yet; ask again once it has".to_owned());
    };
    let id = crate::model::ServiceId::new(&request.namespace, &request.name);
    let Some((service, slices)) = source.inputs(&id) else {
        return not(format!(
            "the agent holds no Service {}/{} (removed since the maps were read? run explain again)",
            request.namespace, request.name
        ));
    };
    let slices: Vec<&SliceSpec> = slices.iter().map(|s| &s.spec).collect();
    match explain_entry(&service, &slices, node, key) {
        Ok(explained) => Answer::Explained(explained),
        Err(err) => not(err.to_string()),
    }
}

/// Answers `asked` (see [`answer`]); a client that has gone is ignored.
pub(crate) fn reply(asked: Asked, source: &impl ChangeSource, node: Option<&NodeContext>) {
    let (request, reply) = asked;
    let _ = reply.send(answer(&request, source, node));
}

/// The requests the server received (none ever when it is not serving).
pub(crate) struct Requests(Option<mpsc::Receiver<Asked>>);

impl Requests {
    /// The next request; never resolves when the server does not serve.
    pub(crate) async fn next(&mut self) -> Asked {
        match &mut self.0 {
            Some(rx) => match rx.recv().await {
                Some(asked) => asked,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

/// The serving socket: removed (if it is still this one) when dropped.
pub(crate) struct ExplainServer {
    path: PathBuf,
    /// The socket file's device and inode.
    file: (u64, u64),
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ExplainServer {
    fn drop(&mut self) {
        self.task.abort();
        // Another agent may have replaced a socket it found dead: only this
        // one's file is removed.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Why the socket cannot be served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("{path}: another process answers on it (a second agent?); give this one --explain-socket PATH or none")]
    InUse { path: PathBuf },
    #[error("{path}: a file that is not a socket is in the way; remove it or give --explain-socket another PATH")]
    NotASocket { path: PathBuf },
    #[error("cannot serve {path}: {source}; give --explain-socket a writable PATH, or none")]
    Io { path: PathBuf, source: io::Error },
}

/// Serves `path` when given (the agent goes on without it when it cannot:
/// explain then says the agent is not reachable).
pub(crate) fn start(path: Option<&Path>) -> (Option<ExplainServer>, Requests) {
    let Some(path) = path else { return (None, Requests(None)) };
    match serve(path) {
        Ok((server, requests)) => {
            info!(path = %path.display(), "serving explain's reasons on a local socket");
            (Some(server), requests)
        }
        Err(err) => {
            warn!(%err, "explain's reasons are not served");
            (None, Requests(None))
        }
    }
}

/// Binds `path` with mode 0600 (a socket left by an agent that is gone is
/// replaced) and serves it in the background.
pub(crate) fn serve(path: &Path) -> Result<(ExplainServer, Requests), ServeError> {
    let io_err = |source| ServeError::Io { path: path.to_owned(), source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::NotASocket { path: path.to_owned() });
        }
        // Only a refused connection means nobody serves it: a full backlog
        // or a denied connect is an agent that is there.
        match std::os::unix::net::UnixStream::connect(path) {
            Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {}
            _ => return Err(ServeError::InUse { path: path.to_owned() }),
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err)?;
    }
    // Bound under another name, made 0600, then renamed into place: no
    // moment where the socket is there with a wider mode.
    let mut staging = path.as_os_str().to_owned();
    staging.push(format!(".{}.new", std::process::id()));
    let staging = PathBuf::from(staging);
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(io_err)?;
    let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&staging, path))
        .and_then(|()| std::fs::symlink_metadata(path));
    let meta = placed.inspect_err(|_| drop(std::fs::remove_file(&staging))).map_err(io_err)?;
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(accept(listener, tx));
    Ok((ExplainServer { path: path.to_owned(), file: (meta.dev(), meta.ino()), task }, Requests(Some(rx))))
}

async fn accept(listener: UnixListener, tx: mpsc::Sender<Asked>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(connection(stream, tx.clone()));
            }
            Err(err) => {
                warn!(%err, "explain socket: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One client: its request, the loop's answer.
async fn connection(stream: UnixStream, tx: mpsc::Sender<Asked>) {
    let answer = match tokio::time::timeout(TIMEOUT, read_line(&stream)).await {
        Ok(Ok(line)) => match serde_json::from_slice::<Request>(&line) {
            Ok(request) => ask_loop(request, &tx).await,
            Err(err) => Answer::NotExplained { reason: format!("not a request: {err}") },
        },
        Ok(Err(err)) => Answer::NotExplained { reason: format!("cannot read the request: {err}") },
        Err(_) => return,
    };
    let mut out = serde_json::to_vec(&answer).expect("an answer serializes");
    out.push(b'\n');
    if let Err(err) = write_all(&stream, &out).await {
        debug!(%err, "explain socket: the client went before its answer");
    }
}

/// The first line the client sends (without its newline), at most
/// `MAX_REQUEST` bytes.
async fn read_line(stream: &UnixStream) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        stream.readable().await?;
        match stream.try_read(&mut buf) {
            Ok(0) => return Ok(line),
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            Err(err) => return Err(err),
        }
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            line.truncate(end);
            return Ok(line);
        }
        if line.len() > MAX_REQUEST {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request longer than 4096 bytes"));
        }
    }
}

async fn write_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

async fn ask_loop(request: Request, tx: &mpsc::Sender<Asked>) -> Answer {
    let (reply, answer) = oneshot::channel();
    let gone = || Answer::NotExplained { reason: "the agent is stopping".to_owned() };
    // One deadline for the queue and the answer: a busy loop says so.
    let asked = async {
        if tx.send((request, reply)).await.is_err() {
            return gone();
        }
        answer.await.unwrap_or_else(|_| gone())
    };
    tokio::time::timeout(TIMEOUT, asked)
        .await
        .unwrap_or_else(|_| Answer::NotExplained { reason: "the agent is busy (a long sync); ask again".to_owned() })
}

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AskError {
    #[error(
        "{path} does not exist: the agent is not running, or runs with another --explain-socket (give --agent-socket)"
    )]
    Missing { path: PathBuf },
    #[error("{path} refuses connections: the agent that made it is gone")]
    Refused { path: PathBuf },
    #[error("{path}: permission denied (the socket is root's: run as root)")]
    Denied { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: the answer is not understood ({source}): is the agent of another version?")]
    Garbled { path: PathBuf, source: serde_json::Error },
}

/// Asks the agent at `path` (blocking; for the command line).
pub(crate) fn ask(path: &Path, request: &Request) -> Result<Answer, AskError> {
    let err = |source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => AskError::Missing { path: path.to_owned() },
        io::ErrorKind::ConnectionRefused => AskError::Refused { path: path.to_owned() },
        io::ErrorKind::PermissionDenied => AskError::Denied { path: path.to_owned() },
        _ => AskError::Io { path: path.to_owned(), source },
    };
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(err)?;
    stream.set_read_timeout(Some(TIMEOUT + Duration::from_secs(5))).map_err(err)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(err)?;
    let mut line = serde_json::to_vec(request).expect("a request serializes");
    line.push(b'\n');
    stream.write_all(&line).map_err(err)?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).map_err(err)?;
    serde_json::from_str(&answer).map_err(|source| AskError::Garbled { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::explain::{EndpointUse, Unused};

    fn request() -> Request {
        Request {
            namespace: "ns".into(),
            name: "web".into(),
            address: "10.96.0.9".parse().unwrap(),
            port: 80,
            protocol: "TCP".into(),
            external: false,
        }
    }

    #[test]
    fn requests_and_answers_round_trip() {
        let line = serde_json::to_string(&request()).unwrap();
        assert_eq!(
            line,
            r#"{"namespace":"ns","name":"web","address":"10.96.0.9","port":80,"protocol":"TCP","external":false}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), request());
        // `external` may be left out.
        let short = r#"{"namespace":"ns","name":"web","address":"10.96.0.9","port":80,"protocol":"tcp"}"#;
        let parsed: Request = serde_json::from_str(short).unwrap();
        assert_eq!(parsed.key().unwrap(), FrontendKey::new("10.96.0.9".parse().unwrap(), 80, Protocol::Tcp));
        assert_eq!(Request { protocol: "sctp".into(), ..request() }.key().unwrap().protocol, Protocol::Sctp);
        assert!(Request { protocol: "DCCP".into(), ..request() }.key().is_err());
        assert_eq!(Request { external: true, ..request() }.key().unwrap().scope, Scope::External, "the external entry");

        let explained = Answer::Explained(Explained {
            port_name: "http".into(),
            local_only: true,
            zone: None,
            endpoints: vec![
                EndpointUse {
                    address: "10.0.0.1".parse().unwrap(),
                    port: Some(8080),
                    node: Some("a".into()),
                    unused: None,
                },
                EndpointUse {
                    address: "10.0.0.2".parse().unwrap(),
                    port: None,
                    node: None,
                    unused: Some(Unused::PortNameUnmatched),
                },
            ],
        });
        let text = serde_json::to_string(&explained).unwrap();
        assert!(text.starts_with(r#"{"result":"explained","port_name":"http""#), "{text}");
        assert!(text.contains(r#""unused":"port-name-unmatched""#), "{text}");
        assert_eq!(serde_json::from_str::<Answer>(&text).unwrap(), explained);
        let not = Answer::NotExplained { reason: "why".into() };
        let text = serde_json::to_string(&not).unwrap();
        assert_eq!(text, r#"{"result":"not-explained","reason":"why"}"#);
        assert_eq!(serde_json::from_str::<Answer>(&text).unwrap(), not);
    }

    /// A served socket: mode 0600, answered through the channel, refused
    /// to a second server, removed when dropped; a client of a missing
    /// socket is told so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_socket_answers_through_the_channel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/agent.sock");
        let missing = ask(&path, &request()).unwrap_err();
        assert!(matches!(missing, AskError::Missing { .. }), "{missing}");
        let (server, mut requests) = serve(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(serve(&path), Err(ServeError::InUse { .. })));
        let loop_side = tokio::spawn(async move {
            let (request, reply) = requests.next().await;
            reply.send(Answer::NotExplained { reason: format!("asked about {}", request.name) }).unwrap();
        });
        let client_path = path.clone();
        let answer = tokio::task::spawn_blocking(move || ask(&client_path, &request())).await.unwrap().unwrap();
        assert_eq!(answer, Answer::NotExplained { reason: "asked about web".into() });
        loop_side.await.unwrap();
        drop(server);
        assert!(!path.exists(), "removed on exit");
        // A socket left behind by an agent that is gone is replaced.
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(matches!(ask(&path, &request()), Err(AskError::Refused { .. })));
        let (server, _requests) = serve(&path).unwrap();
        drop(server);
    }
}
