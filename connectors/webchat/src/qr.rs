//! QR codes for the pairing link: the module matrix from `qrcode`, drawn as a grey-scale PNG
//! (`png`) with the standard four-module quiet zone, and wrapped in a `data:` URL so an
//! `auth.start.ack` carries the picture itself.

use qrcode::{Color, QrCode};

use crate::error::WebchatError;

/// Pixels per QR module.
const SCALE: usize = 6;
/// Light modules around the code, as the QR standard asks.
const QUIET: usize = 4;

/// Draws `text` as a QR code and returns the PNG bytes.
pub fn qr_png(text: &str) -> Result<Vec<u8>, WebchatError> {
    let code = QrCode::new(text.as_bytes()).map_err(WebchatError::QrData)?;
    let modules = code.width();
    let colors = code.to_colors();
    let side = (modules + 2 * QUIET) * SCALE;
    let mut pixels = vec![255u8; side * side];
    for (index, color) in colors.iter().enumerate() {
        if *color != Color::Dark {
            continue;
        }
        let (x, y) = (index % modules, index / modules);
        for dy in 0..SCALE {
            let row = (y + QUIET) * SCALE + dy;
            let start = row * side + (x + QUIET) * SCALE;
            pixels[start..start + SCALE].fill(0);
        }
    }
    let side =
        u32::try_from(side).map_err(|_| WebchatError::InvalidInput("link too long".into()))?;
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, side, side);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&pixels)?;
    }
    Ok(out)
}

/// Draws `text` as a QR code and returns it as a `data:image/png;base64,...` URL.
pub fn qr_data_url(text: &str) -> Result<String, WebchatError> {
    Ok(format!("data:image/png;base64,{}", base64(&qr_png(text)?)))
}

/// Standard base64 with padding (RFC 4648), enough for a data URL.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    #[test]
    fn the_qr_code_is_a_png_with_a_quiet_zone() {
        let png = qr_png("http://127.0.0.1:8080/chat/pair/0123456789abcdef").unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.width, info.height);
        assert_eq!(info.width as usize % SCALE, 0);
        // The corner is light (quiet zone) and the finder pattern starts dark after it.
        assert_eq!(buf[0], 255);
        let at = QUIET * SCALE * info.width as usize + QUIET * SCALE;
        assert_eq!(buf[at], 0);
    }

    #[test]
    fn the_data_url_names_png() {
        assert!(qr_data_url("x").unwrap().starts_with("data:image/png;base64,iVBORw0KGgo"));
    }
}
