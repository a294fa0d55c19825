//! Writes the seed corpus of the state fuzz targets (`fuzz/corpus/<target>_state/`): states made
//! by driving each machine, each followed by a few fixed tails of policy and operation bytes.
//! `cargo run -p sim --example fuzz_seed_states` (it overwrites only the files it writes).

use std::path::Path;

use rand_core::{Rng, SeedableRng};

fn main() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20_261_201);
    let mut written = 0;
    for tail_len in [0usize, 64, 512] {
        let mut tail = vec![0u8; tail_len];
        rng.fill_bytes(&mut tail);
        for (i, (target, input)) in sim::fuzzing::state::seed_inputs(&tail).into_iter().enumerate() {
            let dir = corpus.join(target);
            std::fs::create_dir_all(&dir).expect("the corpus directory can be made");
            std::fs::write(dir.join(format!("seed-{tail_len}-{i:02}")), input).expect("the seed can be written");
            written += 1;
        }
    }
    println!("wrote {written} seeds");
}
