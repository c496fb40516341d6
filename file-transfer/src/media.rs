//! Content types of stored files, parsed instead of compared as strings: a declared type such
//! as `Image/SVG+XML; charset=utf-8` is split into its essence (`image/svg+xml`, lower-cased)
//! and its parameters, so a parameter or a capital letter can never turn a script-carrying
//! type into one a browser is allowed to render inline.
//!
//! Only [`INLINE_IMAGE_TYPES`] (raster formats with no scripting) are ever served inline; every
//! other file is a download with [`DOWNLOAD_CSP`] and `nosniff`.

/// Raster image types a browser may show inline: none of them can carry script.
pub const INLINE_IMAGE_TYPES: &[&str] =
    &["image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp"];

/// `Content-Security-Policy` for every served file: no script, no plugin, no subresource, and a
/// sandbox (a file opened as a document gets an opaque origin, so it cannot read the page's
/// storage or cookies even if a browser ignored the download disposition).
pub const DOWNLOAD_CSP: &str =
    "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox";

/// A parsed `type/subtype; name=value` content type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaType {
    /// `type/subtype`, lower-cased, without parameters or white space.
    pub essence: String,
    /// The parameters, names lower-cased, values as given (quotes removed).
    pub parameters: Vec<(String, String)>,
}

fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
}

impl MediaType {
    /// Parses a content type; `None` when it is not `token/token` (optionally followed by
    /// `;`-separated parameters).
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(';');
        let essence = parts.next()?.trim().to_ascii_lowercase();
        let (kind, subtype) = essence.split_once('/')?;
        if !is_token(kind) || !is_token(subtype) {
            return None;
        }
        let parameters = parts
            .filter_map(|part| {
                let (name, value) = part.split_once('=')?;
                let name = name.trim().to_ascii_lowercase();
                let value = value.trim().trim_matches('"').to_owned();
                is_token(&name).then_some((name, value))
            })
            .collect();
        Some(Self { essence, parameters })
    }

    /// True for the raster types of [`INLINE_IMAGE_TYPES`].
    pub fn is_inline_image(&self) -> bool {
        INLINE_IMAGE_TYPES.contains(&self.essence.as_str())
    }
}

/// The `Content-Type` to serve a stored file with, and whether it may be shown inline: the
/// bare essence for an allow-listed raster image, `application/octet-stream` (a download) for
/// everything else, including unparseable and missing types.
pub fn served_type(declared: Option<&str>) -> (String, bool) {
    match declared.and_then(MediaType::parse) {
        Some(media) if media.is_inline_image() => (media.essence, true),
        _ => ("application/octet-stream".to_owned(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h1_parameters_and_case_never_make_svg_inline() {
        for declared in [
            "image/svg+xml",
            "image/svg+xml;charset=utf-8",
            "IMAGE/SVG+XML",
            " image/svg+xml ; charset=\"utf-8\"",
            "text/html",
            "text/html; charset=utf-8",
            "application/xhtml+xml",
            "image/png, text/html",
            "image/",
            "",
            "image/x-icon",
        ] {
            assert_eq!(
                served_type(Some(declared)),
                ("application/octet-stream".to_owned(), false),
                "{declared:?}"
            );
        }
        assert_eq!(served_type(None), ("application/octet-stream".to_owned(), false));
    }

    #[test]
    fn raster_images_stay_inline_with_their_bare_essence() {
        assert_eq!(served_type(Some("image/png")), ("image/png".to_owned(), true));
        assert_eq!(served_type(Some("Image/JPEG; q=1")), ("image/jpeg".to_owned(), true));
        let parsed = MediaType::parse("text/plain; Charset=\"utf-8\"").unwrap();
        assert_eq!(parsed.essence, "text/plain");
        assert_eq!(parsed.parameters, vec![("charset".to_owned(), "utf-8".to_owned())]);
    }
}
