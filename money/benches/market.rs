//! Order-matching throughput of one in-memory book: a seeded stream of
//! bids and asks around one price (so about half of them trade, many
//! partially), with cancellations. `cargo bench -p money --bench market
//! [-- N]` (default 1,000,000 orders).

use std::time::Instant;

use money::market::book::{Book, Order, Side};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let mut rng = StdRng::seed_from_u64(42);
    let orders: Vec<Order> = (0..n)
        .map(|i| Order {
            id: format!("o{i}"),
            side: if rng.random_bool(0.5) {
                Side::Bid
            } else {
                Side::Ask
            },
            account_id: "bench".into(),
            price: rng.random_range(9_900..10_100),
            quantity: rng.random_range(1..100),
            remaining: 0,
            priority: rng.random_range(0..3),
            interruptible: false,
            expires_at: i64::MAX,
        })
        .map(|o| Order {
            remaining: o.quantity,
            ..o
        })
        .collect();
    let cancels: Vec<bool> = (0..n).map(|_| rng.random_bool(0.1)).collect();
    let mut book = Book::default();
    let (mut fills, mut cancelled) = (0usize, 0usize);
    let t = Instant::now();
    for (i, o) in orders.into_iter().enumerate() {
        fills += book.submit(o, 0).0.len();
        if cancels[i] && i > 0 {
            cancelled += usize::from(book.cancel(&format!("o{}", i / 2)).is_some());
        }
    }
    let secs = t.elapsed().as_secs_f64();
    book.check().expect("consistent book");
    println!(
        "{n} orders in {secs:.3} s: {:.0} orders/s ({fills} fills, {cancelled} cancels, {} resting)",
        n as f64 / secs,
        book.len()
    );
}
