//! A raw HTTP/1.1 server on 127.0.0.1 for peers that misbehave as no real server does (endless
//! bodies, missing headers): each request's method and path go to `respond` with the connection,
//! once its headers were read.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Request {
    pub method: String,
    pub path: String,
}

/// Serves one request per connection, each on a thread, for as long as the test runs; returns
/// `HOST:PORT`.
pub fn serve(respond: impl Fn(Request, &mut TcpStream) + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let respond = Arc::new(respond);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let respond = respond.clone();
            std::thread::spawn(move || {
                let mut request_line = String::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let _ = reader.read_line(&mut request_line);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let mut parts = request_line.split_whitespace();
                let method = parts.next().unwrap_or("").to_owned();
                let path = parts.next().unwrap_or("").to_owned();
                respond(Request { method, path }, &mut stream);
            });
        }
    });
    host
}

/// Writes `head`, then `fill` over and over until `limit` bytes or the client stops reading,
/// counting what was written in `sent`.
pub fn endless(stream: &mut TcpStream, head: &str, fill: u8, limit: u64, sent: &AtomicU64) {
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let block = vec![fill; 64 << 10];
    let mut total = 0u64;
    while total < limit && stream.write_all(&block).is_ok() {
        total += block.len() as u64;
        sent.fetch_add(block.len() as u64, Ordering::Relaxed);
    }
}
