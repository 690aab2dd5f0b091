//! Verifying: every program of the object loaded into the kernel without attaching, and
//! what the verifier said about each (`railscope probes --verify`, the host tests).

use aya::programs::ProgramError;

use super::object::load_object;

/// Result of asking the kernel's verifier about one program.
#[derive(Debug)]
pub struct VerifierResult {
    pub program: String,
    pub result: Result<(), ProgramError>,
}

/// Loads every program of the object into the kernel (without attaching), with default
/// globals, and reports what the verifier said about each. Used by the host tests and by
/// `railscope probes --verify`.
pub fn verify_all() -> Result<Vec<VerifierResult>, aya::EbpfError> {
    let mut ebpf = load_object(&Vec::new())?;
    let mut results = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let result = match program {
            aya::programs::Program::KProbe(p) => p.load(),
            aya::programs::Program::TracePoint(p) => p.load(),
            aya::programs::Program::RawTracePoint(p) => p.load(),
            _ => Err(ProgramError::UnexpectedProgramType),
        };
        results.push(VerifierResult {
            program: name.to_owned(),
            result,
        });
    }
    results.sort_by(|a, b| a.program.cmp(&b.program));
    Ok(results)
}
