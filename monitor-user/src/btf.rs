//! A small reader for the kernel's BTF (BPF Type Format), as exposed in `/sys/kernel/btf/vmlinux`
//! (base BTF) and `/sys/kernel/btf/<module>` (split BTF, whose type ids and string offsets
//! continue after the base's).
//!
//! The agent resolves struct field offsets and enum values of the *running* kernel with it and
//! hands them to the eBPF programs as globals, so no layout is hard-coded for one kernel build.
//! Only the lookups the agent needs are implemented; every offset read from the blob is checked,
//! so a truncated or corrupted file yields an error, never a panic or an endless loop.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

const MAGIC: u16 = 0xEB9F;
const HEADER_LEN: usize = 24;
/// Cap on typedef/modifier chains, nested arrays and anonymous-member nesting (libbpf uses 32
/// too); deeper chains only occur in corrupted or cyclic input.
const MAX_DEPTH: u32 = 32;
/// Cap on the members one lookup visits: corrupted input can make anonymous members fan out
/// exponentially within the depth cap.
const MAX_VISITS: u32 = 1 << 20;
/// BTF does not record pointer sizes; railscope only runs on 64-bit kernels.
const POINTER_SIZE: u32 = 8;

/// BTF kinds (`BTF_KIND_*` in include/uapi/linux/btf.h).
mod kind {
    pub(super) const INT: u32 = 1;
    pub(super) const PTR: u32 = 2;
    pub(super) const ARRAY: u32 = 3;
    pub(super) const STRUCT: u32 = 4;
    pub(super) const UNION: u32 = 5;
    pub(super) const ENUM: u32 = 6;
    pub(super) const FWD: u32 = 7;
    pub(super) const TYPEDEF: u32 = 8;
    pub(super) const VOLATILE: u32 = 9;
    pub(super) const CONST: u32 = 10;
    pub(super) const RESTRICT: u32 = 11;
    pub(super) const FUNC: u32 = 12;
    pub(super) const FUNC_PROTO: u32 = 13;
    pub(super) const VAR: u32 = 14;
    pub(super) const DATASEC: u32 = 15;
    pub(super) const FLOAT: u32 = 16;
    pub(super) const DECL_TAG: u32 = 17;
    pub(super) const TYPE_TAG: u32 = 18;
    pub(super) const ENUM64: u32 = 19;
}

/// Why a BTF blob could not be read or a lookup failed. Every message is one line and names the
/// input: a file path, the name given to [`Btf::parse`] (e.g. `<memory>`), or `base + split`.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{input}: malformed BTF: {reason}")]
    Malformed { input: String, reason: String },
    #[error("{input}: no struct or union named `{name}`")]
    NoSuchType { input: String, name: String },
    #[error("{input}: `{ty}` has no member `{path}`")]
    NoSuchMember {
        input: String,
        ty: String,
        path: String,
    },
    #[error("{input}: `{ty}.{path}`: `{prefix}` is not a struct or union, cannot descend into it")]
    NotComposite {
        input: String,
        ty: String,
        path: String,
        prefix: String,
    },
    #[error("{input}: `{ty}.{path}` is a bitfield or not byte-aligned, it has no byte offset")]
    Bitfield {
        input: String,
        ty: String,
        path: String,
    },
    #[error("{input}: no enum named `{name}`")]
    NoSuchEnum { input: String, name: String },
    #[error("{input}: enum `{name}` has no enumerator `{variant}`")]
    NoSuchVariant {
        input: String,
        name: String,
        variant: String,
    },
    #[error("/sys/kernel/btf: `{name}` is not a module name")]
    BadModuleName { name: String },
}

/// Where a member lives and what it is, as resolved by [`Btf::field`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Byte offset from the start of the outermost struct or union.
    pub offset: u32,
    /// Size in bytes, after resolving typedef/const/volatile/restrict/type_tag.
    pub size: u32,
    pub shape: Shape,
}

/// The kind of a member's type, after resolving typedefs and modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Int { signed: bool },
    Pointer,
    Array { elem_size: u32, len: u32 },
    Struct,
    Union,
    Enum,
    Float,
    Other,
}

/// Parsed kernel BTF: a base blob and, optionally, split blobs layered on top of it.
///
/// Parts are shared: a clone costs a few reference counts, so vmlinux is parsed once and each
/// module's split BTF is layered on a clone of it ([`Btf::with_split`]).
#[derive(Clone)]
pub struct Btf {
    /// `parts[0]` is the base; each later part continues the ids and strings of the one before.
    parts: Vec<Arc<Part>>,
}

/// One blob (base or split) with the positions of its type records.
struct Part {
    input: String,
    data: Vec<u8>,
    /// End of the type section in `data`: records are decoded from `data[..types_end]` only.
    types_end: usize,
    /// Byte offset in `data` of each type record; index 0 is type id `first_id`.
    types: Vec<u32>,
    first_id: u32,
    /// The string section, `data[strs.0..strs.1]`.
    strs: (usize, usize),
    /// Offset of this part's first string in the combined string space.
    str_base: u32,
    /// `(fnv1a(name), id)` of the named types that lookups search, sorted: one allocation
    /// instead of a map of owned strings keeps parsing vmlinux fast.
    names: Vec<(u64, u32)>,
}

/// One decoded type record; `extra` is the kind-specific data after the 12-byte header, its
/// length already checked against the kind and vlen. The default value is `void` (id 0).
#[derive(Clone, Copy, Default)]
struct Ty<'a> {
    id: u32,
    name_off: u32,
    kind: u32,
    vlen: usize,
    kflag: bool,
    /// `size` for INT/STRUCT/UNION/ENUM/ENUM64/FLOAT/DATASEC, `type` for the others.
    size_or_type: u32,
    extra: &'a [u8],
}

/// Results of the private helpers.
type Res<T> = Result<T, BtfError>;
/// A member found by [`Btf::find_member`]: (bit offset, type id, bitfield size).
type Member = (u64, u32, u32);

fn le32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// The `i`-th 32-bit word of `b`; callers index within lengths [`decode`] has validated, so
/// the 0 fallback is never seen.
fn word(b: &[u8], i: usize) -> u32 {
    le32(b, i * 4).unwrap_or(0)
}

/// `base + len` as a u32 id or string offset, if it fits.
fn after(base: u32, len: usize) -> Option<u32> {
    u32::try_from(len).ok()?.checked_add(base)
}

fn fnv1a(s: &[u8]) -> u64 {
    let step = |h: u64, &b: &u8| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    s.iter().fold(0xcbf2_9ce4_8422_2325, step)
}

/// Length of the kind-specific data after a type record's header, or `None` for unknown kinds.
fn extra_len(kind: u32, vlen: usize) -> Option<usize> {
    use kind::*;
    Some(match kind {
        INT | VAR | DECL_TAG => 4,
        PTR | FWD | TYPEDEF | VOLATILE | CONST | RESTRICT | FUNC | FLOAT | TYPE_TAG => 0,
        ARRAY => 12,
        STRUCT | UNION | DATASEC | ENUM64 => vlen * 12,
        ENUM | FUNC_PROTO => vlen * 8,
        _ => return None,
    })
}

/// Decodes the record at `off`; `types` ends where the type section ends.
fn decode(types: &[u8], off: usize, id: u32) -> Result<Ty<'_>, String> {
    let head = |at| le32(types, off.saturating_add(at)).ok_or(format!("type {id} is truncated"));
    let (name_off, info, size_or_type) = (head(0)?, head(4)?, head(8)?);
    let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
    let len = extra_len(kind, vlen).ok_or_else(|| format!("type {id} has unknown kind {kind}"))?;
    let start = off.saturating_add(12);
    let extra = types.get(start..start.saturating_add(len)).ok_or_else(|| {
        format!("type {id} (kind {kind}, vlen {vlen}) runs past the type section")
    })?;
    let kflag = info >> 31 == 1;
    Ok(Ty {
        id,
        name_off,
        kind,
        vlen,
        kflag,
        size_or_type,
        extra,
    })
}

/// The type ids a record refers to: its target (pointers, typedefs, modifiers, functions,
/// variables, tags, a prototype's return type), an array's element and index types, and the
/// types of its members, parameters or section variables.
fn referenced_ids<'a>(t: &Ty<'a>) -> impl Iterator<Item = u32> + 'a {
    use kind::*;
    let words = |stride: usize, at: usize| {
        let extra = t.extra;
        (0..t.vlen).map(move |i| word(extra, i * stride + at))
    };
    let (target, listed): (Option<u32>, Box<dyn Iterator<Item = u32> + 'a>) = match t.kind {
        PTR | TYPEDEF | VOLATILE | CONST | RESTRICT | FUNC | VAR | DECL_TAG | TYPE_TAG => {
            (Some(t.size_or_type), Box::new(std::iter::empty()))
        }
        ARRAY => (
            None,
            Box::new([word(t.extra, 0), word(t.extra, 1)].into_iter()),
        ),
        STRUCT | UNION => (None, Box::new(words(3, 1))),
        FUNC_PROTO => (Some(t.size_or_type), Box::new(words(2, 1))),
        DATASEC => (None, Box::new(words(3, 0))),
        _ => (None, Box::new(std::iter::empty())),
    };
    target.into_iter().chain(listed)
}

fn is_composite(t: &Ty) -> bool {
    t.kind == kind::STRUCT || t.kind == kind::UNION
}

impl Btf {
    /// Parses base BTF (e.g. a copy of `/sys/kernel/btf/vmlinux`); `input` names it in errors.
    pub fn parse(input: &str, data: &[u8]) -> Result<Btf, BtfError> {
        Btf::layer(None, input, data.to_vec())
    }

    /// Parses split BTF (e.g. `/sys/kernel/btf/ib_core`) on top of `base`, whose types and
    /// strings it may reference.
    pub fn parse_split(input: &str, data: &[u8], base: Btf) -> Result<Btf, BtfError> {
        Btf::layer(Some(base), input, data.to_vec())
    }

    /// Reads base BTF from `vmlinux` and, if given, split BTF from `module`.
    pub fn from_files(vmlinux: &Path, module: Option<&Path>) -> Result<Btf, BtfError> {
        let base = Btf::layer(None, &vmlinux.display().to_string(), read_file(vmlinux)?)?;
        match module {
            Some(m) => base.with_split(m),
            None => Ok(base),
        }
    }

    /// This BTF (a parsed vmlinux, shared, not copied) with the split BTF of the file `module`
    /// on top.
    pub fn with_split(&self, module: &Path) -> Result<Btf, BtfError> {
        Btf::layer(
            Some(self.clone()),
            &module.display().to_string(),
            read_file(module)?,
        )
    }

    /// Reads the running kernel's BTF: `/sys/kernel/btf/vmlinux`, plus
    /// `/sys/kernel/btf/<module>` when a module is named (it must be loaded).
    pub fn from_sys_fs(module: Option<&str>) -> Result<Btf, BtfError> {
        let dir = Path::new("/sys/kernel/btf");
        if let Some(m) = module.filter(|m| m.is_empty() || m.contains('/') || m.starts_with('.')) {
            return Err(BtfError::BadModuleName { name: m.to_owned() });
        }
        Btf::from_files(&dir.join("vmlinux"), module.map(|m| dir.join(m)).as_deref())
    }

    /// Byte offset, size and shape of a member reached by a dotted path from a struct or union,
    /// e.g. `field("ib_event", "element.port_num")`, descending through nested and anonymous
    /// struct/union members (an anonymous member's fields are reachable by their own names).
    pub fn field(&self, struct_name: &str, path: &str) -> Result<Field, BtfError> {
        let no_member = || {
            let (input, ty, path) = self.context(struct_name, path);
            BtfError::NoSuchMember { input, ty, path }
        };
        let mut cur = self.find_composite(struct_name)?;
        let (mut bits, mut budget, mut member_type) = (0u64, MAX_VISITS, None);
        let mut walked = 0;
        for comp in path.split('.') {
            if let Some(id) = member_type {
                cur = self.skip_mods(self.ty(id)?)?;
                if !is_composite(&cur) {
                    let (input, ty, path) = self.context(struct_name, path);
                    let prefix = path[..walked - 1].to_owned();
                    return Err(BtfError::NotComposite {
                        input,
                        ty,
                        path,
                        prefix,
                    });
                }
            }
            walked += comp.len() + 1;
            let found = match comp {
                "" => None,
                _ => self.find_member(&cur, comp, 0, &mut budget)?,
            };
            let Some((off, id, bitfield_size)) = found else {
                return Err(no_member());
            };
            if bitfield_size != 0 {
                return Err(self.bitfield(struct_name, path));
            }
            bits += off;
            member_type = Some(id);
        }
        let t = self.skip_mods(self.ty(member_type.unwrap_or(0))?)?;
        // Old-style bitfields (in structs without kind_flag) are INTs narrower than their size,
        // or with a bit offset of their own: INT data is offset << 16 | bits.
        let enc = word(t.extra, 0);
        let int_bitfield = t.kind == kind::INT
            && ((enc >> 16) & 0xff != 0 || u64::from(enc & 0xff) != u64::from(t.size_or_type) * 8);
        if int_bitfield || bits % 8 != 0 {
            return Err(self.bitfield(struct_name, path));
        }
        let offset = u32::try_from(bits / 8)
            .map_err(|_| self.malformed(format!("`{struct_name}.{path}` offset overflows")))?;
        let (size, shape) = self.size_and_shape(t.id, 0)?;
        Ok(Field {
            offset,
            size,
            shape,
        })
    }

    /// Size in bytes of `struct <name>` or `union <name>`.
    pub fn struct_size(&self, struct_name: &str) -> Result<u32, BtfError> {
        Ok(self.find_composite(struct_name)?.size_or_type)
    }

    /// All enumerators of `enum <name>` (ENUM and ENUM64), in declaration order. Unsigned 64-bit
    /// values above `i64::MAX` wrap to negative numbers.
    pub fn enum_values(&self, enum_name: &str) -> Result<Vec<(String, i64)>, BtfError> {
        let is_enum = |t: &Ty| t.kind == kind::ENUM || t.kind == kind::ENUM64;
        let Some(t) = self.find_named(enum_name, is_enum)? else {
            let (input, name) = (self.inputs(), enum_name.to_owned());
            return Err(BtfError::NoSuchEnum { input, name });
        };
        let value = |c: &[u8]| match t.kind {
            // kind_flag marks a signed enum (kernel >= 6.0); without it values are unsigned.
            kind::ENUM if t.kflag => i64::from(word(c, 1) as i32),
            kind::ENUM => i64::from(word(c, 1)),
            _ => ((u64::from(word(c, 2)) << 32) | u64::from(word(c, 1))) as i64,
        };
        let entry = if t.kind == kind::ENUM { 8 } else { 12 };
        let entries = t.extra.chunks_exact(entry);
        entries
            .map(|c| Ok((self.str_at(word(c, 0))?.to_owned(), value(c))))
            .collect()
    }

    /// The value of enumerator `variant` of `enum <enum_name>`.
    pub fn enum_value(&self, enum_name: &str, variant: &str) -> Result<i64, BtfError> {
        let values = self.enum_values(enum_name)?;
        let found = values.into_iter().find(|(n, _)| n == variant);
        let (input, name, variant) = self.context(enum_name, variant);
        found.map(|(_, v)| v).ok_or(BtfError::NoSuchVariant {
            input,
            name,
            variant,
        })
    }

    /// Whether a FUNC named `name` exists (i.e. the kernel has such a traceable function).
    pub fn has_function(&self, name: &str) -> bool {
        self.candidates(name).any(|t| t.kind == kind::FUNC)
    }

    /// Parses `data` as a new part on top of `base` (or as the base) and indexes its names.
    fn layer(base: Option<Btf>, input: &str, data: Vec<u8>) -> Res<Btf> {
        let (first_id, str_base) = match base.as_ref().and_then(|b| b.parts.last()) {
            None => (1, 0),
            Some(p) => after(p.first_id, p.types.len())
                .zip(after(p.str_base, p.strs.1 - p.strs.0))
                .ok_or_else(|| malformed(input, "base BTF is too large to extend".into()))?,
        };
        let part = Part::parse(input, data, (first_id, str_base), base.is_none())
            .map_err(|reason| malformed(input, reason))?;
        let mut btf = base.unwrap_or(Btf { parts: Vec::new() });
        btf.parts.push(Arc::new(part));
        btf.check_references_of_last()?;
        btf.index_last()?;
        Ok(btf)
    }

    /// Refuses a newest part whose types refer to ids past its end, as libbpf's validation
    /// does: a type section cut at a record boundary is well formed record by record, and
    /// only these dangling references show that it was cut.
    fn check_references_of_last(&self) -> Res<()> {
        let Some(last) = self.parts.last() else {
            return Ok(());
        };
        let end = after(last.first_id, last.types.len())
            .ok_or_else(|| malformed(&last.input, "too many types".into()))?;
        for id in (0..last.types.len()).filter_map(|i| after(last.first_id, i)) {
            let t = self.ty(id)?;
            if let Some(to) = referenced_ids(&t).find(|&to| to >= end) {
                return Err(malformed(
                    &last.input,
                    format!(
                        "type {id} (kind {}) refers to type id {to}, past the last type {}",
                        t.kind,
                        end - 1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Fills the name index of the newest part; its names may live in earlier parts' strings.
    fn index_last(&mut self) -> Res<()> {
        use kind::*;
        let Some(last) = self.parts.last() else {
            return Ok(());
        };
        let mut names = Vec::new();
        for id in (0..last.types.len()).filter_map(|i| after(last.first_id, i)) {
            let t = self.ty(id)?;
            if t.name_off != 0 && matches!(t.kind, STRUCT | UNION | ENUM | ENUM64 | FUNC | TYPEDEF)
            {
                names.push((fnv1a(self.str_at(t.name_off)?.as_bytes()), id));
            }
        }
        names.sort_unstable();
        // The newest part was just pushed and is not shared yet.
        if let Some(last) = self.parts.last_mut().and_then(Arc::get_mut) {
            last.names = names;
        }
        Ok(())
    }

    /// Input names of all parts, for errors from lookups spanning them.
    fn inputs(&self) -> String {
        let names: Vec<&str> = self.parts.iter().map(|p| p.input.as_str()).collect();
        names.join(" + ")
    }

    fn malformed(&self, reason: String) -> BtfError {
        malformed(&self.inputs(), reason)
    }

    /// `(inputs, ty, path)` for a lookup error about `ty.path`.
    fn context(&self, ty: &str, path: &str) -> (String, String, String) {
        (self.inputs(), ty.to_owned(), path.to_owned())
    }

    fn bitfield(&self, ty: &str, path: &str) -> BtfError {
        let (input, ty, path) = self.context(ty, path);
        BtfError::Bitfield { input, ty, path }
    }

    fn ty(&self, id: u32) -> Res<Ty<'_>> {
        if id == 0 {
            return Ok(Ty::default());
        }
        let part = self.parts.iter().rev().find(|p| id >= p.first_id);
        let off = part.and_then(|p| Some((p, *p.types.get((id - p.first_id) as usize)?)));
        let Some((part, off)) = off else {
            return Err(self.malformed(format!("reference to type id {id}, which does not exist")));
        };
        decode(&part.data[..part.types_end], off as usize, id)
            .map_err(|r| malformed(&part.input, r))
    }

    fn str_at(&self, off: u32) -> Res<&str> {
        let bad = |what: &str| self.malformed(format!("string offset {off} {what}"));
        let part = self.parts.iter().rev().find(|p| off >= p.str_base);
        let tail = part.and_then(|p| {
            let strs = &p.data[p.strs.0..p.strs.1];
            strs.get((off - p.str_base) as usize..)
                .filter(|t| !t.is_empty())
        });
        let tail = tail.ok_or_else(|| bad("is past the string sections"))?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad("is not NUL-terminated"))?;
        std::str::from_utf8(&tail[..end]).map_err(|_| bad("is not UTF-8"))
    }

    /// Named types (struct, union, enum, func, typedef) called `name`, newest part first so a
    /// module's own types win over same-named ones in vmlinux.
    fn candidates<'a: 'n, 'n>(&'a self, name: &'n str) -> impl Iterator<Item = Ty<'a>> + 'n {
        let hash = fnv1a(name.as_bytes());
        self.parts.iter().rev().flat_map(move |p| {
            let start = p.names.partition_point(|&(h, _)| h < hash);
            let same_hash = p.names[start..]
                .iter()
                .take_while(move |&&(h, _)| h == hash);
            same_hash.filter_map(move |&(_, id)| {
                let t = self.ty(id).ok()?;
                (self.str_at(t.name_off).ok()? == name).then_some(t)
            })
        })
    }

    /// The type called `name` accepted by `want`: preferably one with members/enumerators (a
    /// name can also belong to an empty declaration), else any, else a typedef resolving to one.
    fn find_named(&self, name: &str, want: impl Fn(&Ty) -> bool) -> Res<Option<Ty<'_>>> {
        let mut fallback = None;
        for t in self.candidates(name).filter(|t| want(t)) {
            if t.vlen > 0 {
                return Ok(Some(t));
            }
            fallback = fallback.or(Some(t));
        }
        if fallback.is_some() {
            return Ok(fallback);
        }
        for t in self.candidates(name).filter(|t| t.kind == kind::TYPEDEF) {
            let t = self.skip_mods(t)?;
            if want(&t) {
                return Ok(Some(t));
            }
        }
        Ok(None)
    }

    fn find_composite(&self, name: &str) -> Res<Ty<'_>> {
        let t = self.find_named(name, is_composite)?;
        t.ok_or_else(|| BtfError::NoSuchType {
            input: self.inputs(),
            name: name.into(),
        })
    }

    /// Follows typedef/const/volatile/restrict/type_tag to the underlying type.
    fn skip_mods<'a>(&'a self, mut t: Ty<'a>) -> Res<Ty<'a>> {
        use kind::*;
        for _ in 0..MAX_DEPTH {
            match t.kind {
                TYPEDEF | VOLATILE | CONST | RESTRICT | TYPE_TAG => t = self.ty(t.size_or_type)?,
                _ => return Ok(t),
            }
        }
        let id = t.id;
        Err(self.malformed(format!(
            "type {id} is in a modifier chain deeper than {MAX_DEPTH}"
        )))
    }

    /// Finds member `name` of struct/union `t`, searching anonymous struct/union members too.
    /// Returns (bit offset from the start of `t`, member type id, bitfield size).
    fn find_member(&self, t: &Ty, name: &str, depth: u32, budget: &mut u32) -> Res<Option<Member>> {
        if depth > MAX_DEPTH {
            return Err(self.malformed(format!("anonymous members nest deeper than {MAX_DEPTH}")));
        }
        for m in t.extra.chunks_exact(12) {
            let exhausted = || self.malformed("member search exceeds its step budget".into());
            *budget = budget.checked_sub(1).ok_or_else(exhausted)?;
            let (name_off, member_type, raw) = (word(m, 0), word(m, 1), word(m, 2));
            // With kind_flag, the offset word is bitfield_size << 24 | bit_offset.
            let (bit_off, bitfield_size) = match t.kflag {
                true => (raw & 0xff_ffff, raw >> 24),
                false => (raw, 0),
            };
            if name_off != 0 {
                if self.str_at(name_off)? == name {
                    return Ok(Some((u64::from(bit_off), member_type, bitfield_size)));
                }
                continue;
            }
            let inner = self.skip_mods(self.ty(member_type)?)?;
            if is_composite(&inner)
                && let Some((off, ty, bf)) = self.find_member(&inner, name, depth + 1, budget)?
            {
                return Ok(Some((off + u64::from(bit_off), ty, bf)));
            }
        }
        Ok(None)
    }

    fn size_and_shape(&self, id: u32, depth: u32) -> Res<(u32, Shape)> {
        if depth > MAX_DEPTH {
            return Err(self.malformed(format!("arrays nest deeper than {MAX_DEPTH}")));
        }
        let t = self.skip_mods(self.ty(id)?)?;
        let size = t.size_or_type;
        Ok(match t.kind {
            // INT encoding (bits 24..28): 1 = signed, 2 = char, 4 = bool.
            kind::INT => (
                size,
                Shape::Int {
                    signed: word(t.extra, 0) >> 24 & 1 != 0,
                },
            ),
            kind::PTR => (POINTER_SIZE, Shape::Pointer),
            kind::ARRAY => {
                let (elem, len) = (word(t.extra, 0), word(t.extra, 2));
                let (elem_size, _) = self.size_and_shape(elem, depth + 1)?;
                let total = elem_size.checked_mul(len);
                let overflow = || self.malformed(format!("array type {} is too large", t.id));
                (total.ok_or_else(overflow)?, Shape::Array { elem_size, len })
            }
            kind::STRUCT => (size, Shape::Struct),
            kind::UNION => (size, Shape::Union),
            kind::ENUM | kind::ENUM64 => (size, Shape::Enum),
            kind::FLOAT => (size, Shape::Float),
            _ => (0, Shape::Other),
        })
    }
}

/// A synthetic base and split BTF blob, for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn synthetic_blobs() -> (Vec<u8>, Vec<u8>) {
    tests::synthetic()
}

fn read_file(path: &Path) -> Result<Vec<u8>, BtfError> {
    std::fs::read(path).map_err(|source| BtfError::Io {
        path: path.into(),
        source,
    })
}

fn malformed(input: &str, reason: String) -> BtfError {
    BtfError::Malformed {
        input: input.to_owned(),
        reason,
    }
}

impl Part {
    /// Validates the header and sections and records where each type starts.
    /// `start` is the first type id and string offset; `base` is false for split BTF.
    fn parse(input: &str, data: Vec<u8>, start: (u32, u32), base: bool) -> Result<Part, String> {
        let (first_id, str_base) = start;
        let len = data.len();
        if len < HEADER_LEN || u32::try_from(len).is_err() {
            return Err(format!("{len} bytes is not a plausible size for BTF"));
        }
        match u16::from_le_bytes([data[0], data[1]]) {
            MAGIC => {}
            m if m == MAGIC.swap_bytes() => return Err("big-endian BTF is not supported".into()),
            m => return Err(format!("bad magic {m:#06x}, expected {MAGIC:#06x}")),
        }
        if data[2] != 1 {
            return Err(format!("unsupported version {}", data[2]));
        }
        let field = |i| word(&data, i) as usize;
        let hdr_len = field(1);
        if !(HEADER_LEN..=len).contains(&hdr_len) {
            return Err(format!(
                "header length {hdr_len} is invalid for {len} bytes"
            ));
        }
        let section = |what: &str, off: usize, size: usize| {
            let start = hdr_len.checked_add(off);
            match start.and_then(|s| Some((s, s.checked_add(size)?))) {
                Some((start, end)) if end <= len => Ok((start, end)),
                _ => Err(format!(
                    "{what} section ({size} bytes at {off}) ends past {len} bytes"
                )),
            }
        };
        let (types_start, types_end) = section("type", field(2), field(3))?;
        let strs = section("string", field(4), field(5))?;
        let str_bytes = &data[strs.0..strs.1];
        if base && str_bytes.first() != Some(&0) {
            return Err("base string section does not start with an empty string".into());
        }
        if str_bytes.last().is_some_and(|&b| b != 0) {
            return Err("string section does not end with a NUL".into());
        }
        if after(str_base, str_bytes.len()).is_none() {
            return Err("string section is too large".into());
        }
        let mut types = Vec::new();
        let mut pos = types_start;
        while pos < types_end {
            let id = after(first_id, types.len()).ok_or("too many types")?;
            let t = decode(&data[..types_end], pos, id)?;
            types.push(pos as u32); // fits: `len` fits in a u32
            pos += 12 + t.extra.len();
        }
        after(first_id, types.len()).ok_or("too many types")?;
        Ok(Part {
            input: input.to_owned(),
            data,
            types_end,
            types,
            first_id,
            strs,
            str_base,
            names: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Shape::*;
    use super::*;

    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

    /// The host's vmlinux BTF. Every machine railscope targets (and CI) has it: the probes
    /// cannot be configured without it, so its absence fails the tests.
    fn vmlinux() -> Vec<u8> {
        std::fs::read(VMLINUX).unwrap_or_else(|e| panic!("{VMLINUX}: {e}"))
    }

    /// `(offset, size, shape)` of `s.path`, for compact assertions.
    fn at(btf: &Btf, s: &str, path: &str) -> (u32, u32, Shape) {
        let f = btf.field(s, path).unwrap_or_else(|e| panic!("{e}"));
        (f.offset, f.size, f.shape)
    }

    fn array(elem_size: u32, len: u32) -> Shape {
        Array { elem_size, len }
    }

    /// A test-only BTF encoder: type records, strings, known strings with their offsets, and the
    /// next string's offset. A split encoder starts with its base's strings and reuses them.
    struct Enc(Vec<u8>, Vec<u8>, Vec<(String, u32)>, u32);

    impl Enc {
        fn base() -> Enc {
            Enc(Vec::new(), vec![0], vec![(String::new(), 0)], 1)
        }
        fn split(base: &Enc) -> Enc {
            Enc(Vec::new(), Vec::new(), base.2.clone(), base.3)
        }
        /// The offset of string `s`, added if new.
        fn s(&mut self, s: &str) -> u32 {
            if let Some(&(_, off)) = self.2.iter().find(|(k, _)| k == s) {
                return off;
            }
            self.1.extend_from_slice(format!("{s}\0").as_bytes());
            self.2.push((s.to_owned(), self.3));
            self.3 += s.len() as u32 + 1;
            self.3 - s.len() as u32 - 1
        }
        /// Member-like records: (name, word, word); `enum_like` keeps only the first word.
        fn m(&mut self, enum_like: bool, ms: &[(&str, u32, u32)]) -> Vec<u32> {
            let words = |&(n, a, b): &(&str, u32, u32)| [self.s(n), a, b];
            let all: Vec<[u32; 3]> = ms.iter().map(words).collect();
            all.iter()
                .flat_map(|w| &w[..if enum_like { 2 } else { 3 }])
                .copied()
                .collect()
        }
        /// Adds a type record.
        fn t(&mut self, name: &str, kind: u32, kflag: bool, vlen: u32, st: u32, extra: &[u32]) {
            let info = (u32::from(kflag) << 31) | (kind << 24) | vlen;
            for w in [self.s(name), info, st].iter().chain(extra) {
                self.0.extend_from_slice(&w.to_le_bytes());
            }
        }
        fn blob(&self) -> Vec<u8> {
            let (tl, sl) = (self.0.len() as u32, self.1.len() as u32);
            let header = [24, 0, tl, tl, sl].map(u32::to_le_bytes);
            [&[0x9f, 0xeb, 1, 0], header.as_flattened(), &self.0, &self.1].concat()
        }
    }

    /// Base: ids 1..=22 covering every kind; split: ids 23..=27 using base types and strings
    /// from both sections.
    pub(super) fn synthetic() -> (Vec<u8>, Vec<u8>) {
        use kind::*;
        let mut b = Enc::base();
        b.t("int", INT, false, 0, 4, &[(1 << 24) | 32]); // 1
        b.t("", PTR, false, 0, 0, &[]); // 2: void *
        let m = b.m(false, &[("a", 1, 0), ("b", 1, 32)]);
        b.t("pair", STRUCT, false, 2, 8, &m); // 3: struct pair { int a, b; }
        b.t("pair_t", TYPEDEF, false, 0, 3, &[]); // 4
        b.t("unsigned char", INT, false, 0, 1, &[8]); // 5
        b.t("", ARRAY, false, 0, 0, &[5, 1, 16]); // 6: unsigned char[16]
        let m = b.m(
            true,
            &[("RED", 0, 0), ("GREEN", 1, 0), ("BLUE", u32::MAX, 0)],
        );
        b.t("color", ENUM, true, 3, 4, &m); // 7: a signed enum
        let m = b.m(false, &[("HUGE", 0, 1 << 8)]);
        b.t("big", ENUM64, false, 1, 8, &m); // 8
        b.t("later", FWD, false, 0, 0, &[]); // 9: struct later;
        b.t("", FUNC_PROTO, false, 1, 1, &[0, 1]); // 10: int (int)
        b.t("do_thing", FUNC, false, 1, 10, &[]); // 11
        b.t("", CONST, false, 0, 4, &[]); // 12: const pair_t
        b.t("gvar", VAR, false, 0, 1, &[1]); // 13
        b.t(".data", DATASEC, false, 1, 4, &[13, 0, 4]); // 14
        b.t("double", FLOAT, false, 0, 8, &[]); // 15
        b.t("tag", DECL_TAG, false, 0, 3, &[u32::MAX]); // 16
        b.t("user", TYPE_TAG, false, 0, 2, &[]); // 17: void __user *
        b.t("", VOLATILE, false, 0, 1, &[]); // 18
        b.t("", RESTRICT, false, 0, 2, &[]); // 19
        let m = b.m(false, &[("x", 1, 0)]);
        b.t("later", STRUCT, false, 1, 4, &m); // 20: struct later { int x; }
        b.t("bf3", INT, false, 0, 4, &[3]); // 21: a 3-bit int, an old-style bitfield
        let m = b.m(false, &[("f", 21, 0)]);
        b.t("oldbf", STRUCT, false, 1, 4, &m); // 22
        let mut s = Enc::split(&b);
        let (tp, x) = (("tp", 17, 320), ("x", 1, 352)); // `x` is a base string
        let (name, flags) = (("name", 6, 160), ("flags", 1, (3 << 24) | 128));
        let m = s.m(false, &[("hdr", 12, 0), ("", 24, 64), flags, name, tp, x]);
        s.t("outer", STRUCT, true, 6, 48, &m); // 23
        let m = s.m(false, &[("p", 2, 0), ("", 25, 0)]);
        s.t("", UNION, false, 2, 8, &m); // 24: union { void *p; struct { ... }; }
        let m = s.m(false, &[("lo", 1, 0), ("hi", 18, 32)]);
        s.t("", STRUCT, false, 2, 8, &m); // 25: struct { int lo; volatile int hi; }
        let m = s.m(true, &[("S_ONE", 1, 0)]);
        s.t("split_enum", ENUM, false, 1, 4, &m); // 26
        s.t("split_fn", FUNC, false, 0, 10, &[]); // 27
        (b.blob(), s.blob())
    }

    fn synthetic_btf() -> Btf {
        let (base, split) = synthetic();
        let base = Btf::parse("<memory>", &base).expect("synthetic base parses");
        Btf::parse_split("<split>", &split, base).expect("synthetic split parses")
    }

    /// Runs every lookup kind; on corrupted input only the absence of panics and hangs matters.
    fn exercise(btf: &Btf) {
        let fields = [
            ("list_head", "next"),
            ("sock", "__sk_common.skc_num"),
            ("outer", "lo"),
        ];
        fields.iter().for_each(|(s, f)| drop(btf.field(s, f)));
        let _ = (btf.enum_values("bpf_prog_type"), btf.enum_values("color"));
        let _ = (btf.struct_size("pair_t"), btf.has_function("schedule"));
    }

    /// The message of the error `r` must hold.
    fn msg<T>(r: Result<T, BtfError>) -> String {
        r.map(drop).unwrap_err().to_string()
    }

    #[test]
    fn vmlinux_list_head_enum_and_function() {
        let data = vmlinux();
        let start = std::time::Instant::now();
        let btf = Btf::parse(VMLINUX, &data).unwrap();
        let n = btf.parts[0].types.len();
        eprintln!("parsed {n} types of {VMLINUX} in {:?}", start.elapsed());
        assert!(n > 10_000);
        assert_eq!(at(&btf, "list_head", "next"), (0, 8, Pointer));
        assert_eq!(at(&btf, "list_head", "prev"), (8, 8, Pointer));
        assert_eq!(btf.struct_size("list_head").unwrap(), 16);
        let prog_types = btf.enum_values("bpf_prog_type").unwrap();
        assert_eq!(prog_types[0], ("BPF_PROG_TYPE_UNSPEC".into(), 0));
        let kprobe = btf.enum_value("bpf_prog_type", "BPF_PROG_TYPE_KPROBE");
        assert_eq!(kprobe.unwrap(), 2);
        assert!(btf.has_function("schedule"));
        assert!(!btf.has_function("list_head"));
    }

    #[test]
    fn vmlinux_anonymous_members() {
        let data = vmlinux();
        let btf = Btf::parse(VMLINUX, &data).unwrap();
        // struct sock_common: union { __addrpair; struct { __be32 skc_daddr, skc_rcv_saddr; }; }
        // then union { unsigned int skc_hash; __u16 skc_u16hashes[2]; }, then the port pair.
        let uint = Int { signed: false };
        let sk = |path| at(&btf, "sock", path);
        let common_size = btf.struct_size("sock_common").unwrap();
        assert_eq!(sk("__sk_common"), (0, common_size, Struct));
        assert_eq!(sk("__sk_common.skc_rcv_saddr"), (4, 4, uint));
        assert_eq!(sk("__sk_common.skc_u16hashes"), (8, 4, array(2, 2)));
        assert_eq!(sk("__sk_common.skc_dport"), (12, 2, uint));
        assert_eq!(sk("__sk_common.skc_num"), (14, 2, uint));
        let e = msg(btf.field("sock", "__sk_common.nope"));
        assert!(
            e.ends_with("`sock` has no member `__sk_common.nope`"),
            "{e}"
        );
    }

    #[test]
    fn synthetic_split_resolves() {
        let btf = synthetic_btf();
        let int = Int { signed: true };
        let outer = |path| at(&btf, "outer", path);
        assert_eq!(btf.find_composite("outer").unwrap().id, 23);
        assert_eq!(btf.struct_size("outer").unwrap(), 48);
        assert_eq!(outer("hdr"), (0, 8, Struct));
        assert_eq!(outer("hdr.b"), (4, 4, int));
        assert_eq!(outer("p"), (8, 8, Pointer));
        assert_eq!(outer("lo"), (8, 4, int));
        assert_eq!(outer("hi"), (12, 4, int));
        assert_eq!(outer("name"), (20, 16, array(1, 16)));
        assert_eq!(outer("tp"), (40, 8, Pointer));
        assert_eq!(outer("x"), (44, 4, int));
        // The FWD `later` comes first but the STRUCT with members wins; typedef names work too.
        assert_eq!(at(&btf, "later", "x"), (0, 4, int));
        assert_eq!(btf.struct_size("pair_t").unwrap(), 8);
        let colors = btf.enum_values("color").unwrap();
        let want = [("RED", 0), ("GREEN", 1), ("BLUE", -1)].map(|(n, v)| (n.to_owned(), v));
        assert_eq!(colors, want);
        assert_eq!(btf.enum_value("big", "HUGE").unwrap(), 1 << 40);
        assert_eq!(btf.enum_value("split_enum", "S_ONE").unwrap(), 1);
        assert!(btf.has_function("do_thing") && btf.has_function("split_fn"));
        assert!(!btf.has_function("pair") && !btf.has_function("nothing"));
        // The base alone does not see the split's types.
        let base = Btf::parse("<memory>", &synthetic().0).unwrap();
        assert_eq!(
            msg(base.field("outer", "x")),
            "<memory>: no struct or union named `outer`"
        );
    }

    #[test]
    fn synthetic_lookup_errors() {
        let btf = synthetic_btf();
        let err = |r: Result<(), BtfError>| msg(r).replacen("<memory> + <split>: ", "", 1);
        let field = |s, p| err(btf.field(s, p).map(drop));
        assert_eq!(field("missing", "a"), "no struct or union named `missing`");
        assert_eq!(field("outer", "nope"), "`outer` has no member `nope`");
        assert_eq!(field("outer", ""), "`outer` has no member ``");
        assert_eq!(field("outer", "hdr..a"), "`outer` has no member `hdr..a`");
        let e = field("outer", "x.y");
        assert_eq!(
            e,
            "`outer.x.y`: `x` is not a struct or union, cannot descend into it"
        );
        let bitfield = " is a bitfield or not byte-aligned, it has no byte offset";
        assert_eq!(field("outer", "flags"), format!("`outer.flags`{bitfield}"));
        assert_eq!(field("oldbf", "f"), format!("`oldbf.f`{bitfield}"));
        assert_eq!(
            err(btf.enum_values("nope").map(drop)),
            "no enum named `nope`"
        );
        let e = err(btf.enum_value("color", "PINK").map(drop));
        assert_eq!(e, "enum `color` has no enumerator `PINK`");
        let e = msg(Btf::from_sys_fs(Some("../x")));
        assert_eq!(e, "/sys/kernel/btf: `../x` is not a module name");
        let e = msg(Btf::from_files(Path::new("/nonexistent/vmlinux"), None));
        assert!(e.starts_with("/nonexistent/vmlinux: "), "{e}");
    }

    #[test]
    fn malformed_headers_are_errors() {
        let (base, _) = synthetic();
        let check = |mutate: &dyn Fn(&mut Vec<u8>), want: &str| {
            let mut b = base.clone();
            mutate(&mut b);
            let e = msg(Btf::parse("<memory>", &b));
            let ok = e.starts_with("<memory>: malformed BTF: ") && e.contains(want);
            assert!(ok, "{e}");
        };
        check(&|b| b.truncate(10), "10 bytes is not a plausible size");
        check(&|b| b.swap(0, 1), "big-endian");
        check(&|b| b[0] = 0, "bad magic 0xeb00");
        check(&|b| b[2] = 2, "version 2");
        check(&|b| b[4] = 8, "header length 8");
        check(&|b| b[20] = 0xff, "string section");
        check(&|b| b[24 + 7] = 0x1f, "type 1 has unknown kind 31"); // first type's info byte 3
        check(&|b| b[12] -= 1, "runs past the type section");
        check(&|b| b[52 + 2] = 0xff, "past the string sections"); // struct pair's name_off
        check(&|b| *b.last_mut().unwrap() = b'x', "end with a NUL");
    }

    #[test]
    fn a_type_section_cut_between_records_is_refused() {
        // Every record before the cut is whole; only the references past it show the cut.
        let (base, split) = synthetic();
        let cut_after_outer = 12 + 6 * 12; // record 23: a header and six members
        let mut cut = split.clone();
        cut[12..16].copy_from_slice(&(cut_after_outer as u32).to_le_bytes());
        let base_btf = Btf::parse("<memory>", &base).unwrap();
        let e = msg(Btf::parse_split("<split>", &cut, base_btf));
        assert_eq!(
            e,
            "<split>: malformed BTF: type 23 (kind 4) refers to type id 24, past the last type 23"
        );
        // A base whose pointer refers forward, cut after the pointer.
        let mut b = Enc::base();
        b.t("", kind::PTR, false, 0, 2, &[]); // 1: struct s *
        b.t("s", kind::STRUCT, false, 0, 0, &[]); // 2
        let mut blob = b.blob();
        assert!(Btf::parse("<memory>", &blob).is_ok());
        blob[12..16].copy_from_slice(&12u32.to_le_bytes());
        let e = msg(Btf::parse("<memory>", &blob));
        assert!(
            e.ends_with("type 1 (kind 2) refers to type id 2, past the last type 1"),
            "{e}"
        );
    }

    #[test]
    fn cycles_and_fanout_terminate() {
        use kind::*;
        let mut b = Enc::base();
        b.t("loop", TYPEDEF, false, 0, 1, &[]); // 1: typedef loop loop;
        b.t("", STRUCT, false, 1, 4, &[0, 2, 0]); // 2: an anonymous struct containing itself
        b.t("wide", STRUCT, false, 1, 4, &[0, 2, 0]); // 3
        // 4..=19: each has 8 anonymous members of the next: 8^16 paths without the visit budget.
        for id in 4..20 {
            let fan: Vec<u32> = (0..8).flat_map(|_| [0, id + 1, 0]).collect();
            b.t(if id == 4 { "a" } else { "" }, STRUCT, false, 8, 4, &fan);
        }
        b.t("", STRUCT, false, 0, 4, &[]); // 20
        let btf = Btf::parse("<memory>", &b.blob()).unwrap();
        let e = msg(btf.field("loop", "x"));
        assert!(
            e.contains("type 1 is in a modifier chain deeper than 32"),
            "{e}"
        );
        let e = msg(btf.field("wide", "x"));
        assert!(e.contains("anonymous members nest deeper than 32"), "{e}");
        let e = msg(btf.field("a", "x"));
        assert!(e.contains("member search exceeds its step budget"), "{e}");
    }

    fn flip(data: &[u8], bit: usize) -> Vec<u8> {
        let mut d = data.to_vec();
        d[bit / 8] ^= 1 << (bit % 8);
        d
    }

    #[test]
    fn truncations_and_bit_flips_never_panic() {
        let (base, split) = synthetic();
        let both = |b: &[u8], s: &[u8]| {
            let Ok(base) = Btf::parse("<memory>", b) else {
                return false;
            };
            exercise(&base);
            let btf = Btf::parse_split("<split>", s, base);
            btf.map(|btf| exercise(&btf)).is_ok()
        };
        for n in 0..base.len() {
            assert!(!both(&base[..n], &split), "base prefix {n} parsed");
        }
        let mut ok = 0;
        (0..=split.len()).for_each(|n| ok += usize::from(both(&base, &split[..n])));
        (0..base.len() * 8).for_each(|i| ok += usize::from(both(&flip(&base, i), &split)));
        (0..split.len() * 8).for_each(|i| ok += usize::from(both(&base, &flip(&split, i))));
        assert!(
            ok > 100,
            "only {ok} mutants parsed: the mutations test little"
        );
        let data = vmlinux();
        let cuts = (0..4096).chain((1..32).map(|i| data.len() * i / 32));
        for n in cuts.chain([data.len() - 1]) {
            assert!(
                Btf::parse(VMLINUX, &data[..n]).is_err(),
                "prefix {n} parsed"
            );
        }
        // Cut the type section itself (the header rewritten to match) inside a record: every
        // record's length is a multiple of 4, so an odd cut splits one on any kernel. (A cut at
        // a record boundary is `a_type_section_cut_between_records_is_refused`'s.)
        let type_len = word(&data, 3);
        for cut in [1, 5, 13, 1001, 65_537, (type_len / 3) | 1, type_len - 1] {
            let mut d = data.clone();
            d[12..16].copy_from_slice(&cut.to_le_bytes());
            assert!(
                Btf::parse(VMLINUX, &d).is_err(),
                "type section cut at {cut} parsed"
            );
        }
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let d = flip(&data, (rng % (data.len() as u64 * 8)) as usize);
            if let Ok(btf) = Btf::parse(VMLINUX, &d) {
                exercise(&btf);
            }
        }
    }

    #[test]
    #[ignore = "needs ib_core BTF: runs inside the soft-RoCE test bed"]
    fn ib_core_ib_event_layout() {
        let btf = Btf::from_sys_fs(Some("ib_core")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(at(&btf, "ib_event", "device"), (0, 8, Pointer));
        let (offset, size, _) = at(&btf, "ib_event", "element.port_num");
        assert_eq!((offset, size), (8, 4));
        assert_eq!(at(&btf, "ib_event", "event").0, 16);
        assert_eq!(at(&btf, "ib_device", "name").2, array(1, 64));
        let ev = |v| btf.enum_value("ib_event_type", v).unwrap();
        assert_eq!(ev("IB_EVENT_PORT_ACTIVE"), 9);
        assert_eq!(ev("IB_EVENT_PORT_ERR"), 10);
        assert_eq!(ev("IB_EVENT_DEVICE_FATAL"), 8);
        assert!(btf.has_function("ib_dispatch_event"));
    }
}
