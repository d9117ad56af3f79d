//! Tests of the layout checker's scanner and graph.

use super::graph::{test_paths, test_sccs};
use super::scan::{blank_comments_and_strings, tokenize};

fn strs(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

#[test]
fn comments_strings_and_char_literals_are_blanked_lifetimes_kept() {
    let src = "let a = \"crate::x\"; // crate::y\n/* crate::z /* nested */ */ let c = '{'; fn f<'a>(x: &'a u8) {}\nlet r = r#\"super::q\"#;";
    let out = blank_comments_and_strings(src);
    assert!(!out.contains("crate"), "{out}");
    assert!(!out.contains("super"), "{out}");
    assert!(!out.contains('{') || out.contains("{}"), "{out}");
    assert!(out.contains("<'a>"), "{out}");
    assert_eq!(out.lines().count(), src.lines().count());
    let toks: Vec<_> = tokenize(&out).into_iter().map(|t| t.text).collect();
    assert_eq!(toks.iter().filter(|t| *t == "{").count(), 1, "{toks:?}");
}

#[test]
fn use_trees_expand_and_resolve_crate_super_self_and_children() {
    let known: &[&[&str]] = &[
        &[],
        &["ops"],
        &["ops", "conv"],
        &["ops", "conv", "cpu"],
        &["layout"],
    ];
    let src = "use crate::ops::{conv::{cpu::kernel, Geometry}, Other};\n\
               use super::super::layout::Layout as L;\n\
               pub use cpu::kernel as k;\n\
               fn f() { let x = crate::layout::make(); self::helper(); serde::x(); }";
    let got = test_paths(src, &["ops", "conv"], known);
    let want = vec![
        (strs(&["ops", "conv", "cpu", "kernel"]), false),
        (strs(&["ops", "conv", "Geometry"]), false),
        (strs(&["ops", "Other"]), false),
        (strs(&["layout", "Layout"]), false),
        (strs(&["ops", "conv", "cpu", "kernel"]), true),
        (strs(&["layout", "make"]), false),
        (strs(&["ops", "conv", "helper"]), false),
    ];
    assert_eq!(got, want);
}

#[test]
fn super_inside_an_inline_module_is_the_file_itself() {
    let known: &[&[&str]] = &[&[], &["a"], &["b"]];
    let src =
        "mod tests { use super::*; fn t() { super::super::b::f(); } }\nfn g() { super::b::h(); }";
    let got = test_paths(src, &["a"], known);
    assert_eq!(
        got,
        vec![
            (strs(&["a"]), false),
            (strs(&["b", "f"]), false),
            (strs(&["b", "h"]), false),
        ]
    );
}

#[test]
fn strongly_connected_groups_are_found() {
    // 0 -> 1 -> 2 -> 0 is a cycle; 3 -> 0 and 4 alone are not.
    let adj = vec![vec![1], vec![2], vec![0], vec![0], vec![]];
    let mut groups: Vec<_> = test_sccs(&adj)
        .into_iter()
        .filter(|g| g.len() > 1)
        .collect();
    groups.sort();
    assert_eq!(groups, vec![vec![0, 1, 2]]);
}
