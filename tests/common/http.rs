//! A small HTTP/1.1 file server on 127.0.0.1 for the download tests: it serves a folder (GET and
//! HEAD, `Range: bytes=N-` answered with 206), logs every request, and injects the faults a real
//! network produces, per path. It stops by itself when dropped, or after `LIFETIME` at most.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LIFETIME: Duration = Duration::from_secs(600);

/// What the server does to one path's requests.
#[derive(Clone, Debug)]
pub enum Fault {
    /// 404 Not Found.
    NotFound,
    /// 503 for the first `n` requests, then the file.
    Unavailable(usize),
    /// The file with one byte flipped in the middle.
    Corrupt,
    /// The first body longer than this many bytes is cut there (the connection closed).
    CloseAfter(u64),
    /// Accepts the request and never answers.
    Stall,
    /// The body at about this many bytes per second.
    Throttle(u64),
}

/// A path answered otherwise than from the folder: a redirect (with headers), or a file from
/// elsewhere with extra headers (how the hub emulator of `tests/hub.rs` speaks hf-hub's protocol).
#[derive(Clone, Debug)]
pub enum Route {
    Redirect {
        location: String,
        headers: Vec<(String, String)>,
    },
    File {
        path: PathBuf,
        headers: Vec<(String, String)>,
    },
}

/// One request as the server saw it: the path and the `Range` header, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
}

pub struct Server {
    pub url: String,
    pub log: Arc<Mutex<Vec<Request>>>,
    faults: Arc<Mutex<HashMap<String, Fault>>>,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Serves the files under `root` at `url` + "/" + their relative path.
    pub fn start(root: PathBuf) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let faults: Arc<Mutex<HashMap<String, Fault>>> = Arc::default();
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (log2, faults2, routes2, stop2) =
            (log.clone(), faults.clone(), routes.clone(), stop.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let served: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
            while !stop2.load(Ordering::SeqCst) && started.elapsed() < LIFETIME {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (root, log, faults, routes, served, stop) = (
                            root.clone(),
                            log2.clone(),
                            faults2.clone(),
                            routes2.clone(),
                            served.clone(),
                            stop2.clone(),
                        );
                        std::thread::spawn(move || {
                            let shared = Shared {
                                log: &log,
                                faults: &faults,
                                routes: &routes,
                                served: &served,
                                stop: &stop,
                            };
                            let _ = handle(stream, &root, &shared);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server {
            url,
            log,
            faults,
            routes,
            stop,
        }
    }

    pub fn route(&self, path: &str, route: Route) {
        self.routes.lock().unwrap().insert(path.to_string(), route);
    }

    pub fn fault(&self, path: &str, fault: Fault) {
        self.faults.lock().unwrap().insert(path.to_string(), fault);
    }

    pub fn clear_faults(&self) {
        self.faults.lock().unwrap().clear();
    }

    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The server's state, as a connection's thread sees it.
struct Shared<'a> {
    log: &'a Mutex<Vec<Request>>,
    faults: &'a Mutex<HashMap<String, Fault>>,
    routes: &'a Mutex<HashMap<String, Route>>,
    served: &'a Mutex<HashMap<String, usize>>,
    stop: &'a AtomicBool,
}

fn handle(stream: TcpStream, root: &std::path::Path, shared: &Shared) -> std::io::Result<()> {
    let Shared {
        log,
        faults,
        routes,
        served,
        stop,
    } = *shared;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts
        .next()
        .unwrap_or("/")
        .trim_start_matches('/')
        .to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("range")
        {
            range = Some(value.trim().to_string());
        }
    }
    log.lock().unwrap().push(Request {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
    });
    let count = {
        let mut served = served.lock().unwrap();
        let n = served.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let fault = faults.lock().unwrap().get(&path).cloned();
    let mut out = stream;
    let status = |out: &mut TcpStream, code: &str| {
        write!(
            out,
            "HTTP/1.1 {code}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    match fault {
        Some(Fault::NotFound) => return status(&mut out, "404 Not Found"),
        Some(Fault::Unavailable(n)) if count <= n => {
            return status(&mut out, "503 Service Unavailable");
        }
        Some(Fault::Stall) => {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return Ok(());
        }
        _ => {}
    }
    let route = routes.lock().unwrap().get(&path).cloned();
    let (file, extra) = match route {
        Some(Route::Redirect { location, headers }) => {
            let extra: String = headers
                .iter()
                .map(|(k, v)| format!("{k}: {v}\r\n"))
                .collect();
            return write!(
                out,
                "HTTP/1.1 302 Found\r\nLocation: {location}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
        Some(Route::File { path, headers }) => (path, headers),
        None => (root.join(&path), Vec::new()),
    };
    let Ok(mut body) = std::fs::read(file) else {
        return status(&mut out, "404 Not Found");
    };
    if matches!(fault, Some(Fault::Corrupt)) {
        let middle = body.len() / 2;
        body[middle] ^= 0xff;
    }
    // "bytes=N-" or "bytes=N-M".
    let bounds = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok())));
    let total = body.len() as u64;
    let (start, end) = match bounds {
        Some((s, _)) if s >= total => return status(&mut out, "416 Range Not Satisfiable"),
        Some((s, e)) => (s, e.map_or(total, |e| (e + 1).min(total))),
        None => (0, total),
    };
    let head = match bounds {
        Some(_) => format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{total}\r\n",
            end - start,
            end - 1
        ),
        None => format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n"),
    };
    let extra: String = extra.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let etag = if extra.to_ascii_lowercase().contains("etag") {
        String::new()
    } else {
        format!("ETag: \"{total}\"\r\n")
    };
    write!(out, "{head}{etag}{extra}Connection: close\r\n\r\n")?;
    if method == "HEAD" {
        return Ok(());
    }
    let body = &body[start as usize..end as usize];
    match fault {
        Some(Fault::CloseAfter(n)) if body.len() as u64 > n && first_cut(served, &path) => {
            out.write_all(&body[..(n as usize).min(body.len())])?;
            out.flush()?;
            out.shutdown(std::net::Shutdown::Both)
        }
        Some(Fault::Throttle(rate)) => {
            let piece = (rate / 20).max(1) as usize;
            for chunk in body.chunks(piece) {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                out.write_all(chunk)?;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        }
        _ => out.write_all(body),
    }
}

/// True the first time a body of `path` is cut.
fn first_cut(served: &Mutex<HashMap<String, usize>>, path: &str) -> bool {
    let mut served = served.lock().unwrap();
    let cuts = served.entry(format!("cut:{path}")).or_default();
    *cuts += 1;
    *cuts == 1
}
