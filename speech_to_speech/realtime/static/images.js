// Images: "Attach image" (the camera on a phone) sends the picture at once as a user item,
// conversation.item.create with an input_image part; the next question is about it. The picture is
// first shrunk to a JPEG that fits one data channel message (see IMAGE_MAX_CHARS). A server whose
// model cannot see answers with an error naming the event; the picture is then marked "not seen".

// the longest side of a sent image, px: vision models work on smaller tiles (SmolVLM 512 px; OpenAI's
// high detail scales to 768 px on the short side), so more only costs bytes
const IMAGE_MAX_SIDE = 1024;
// the longest data URL sent, characters: one data channel message holds at most 256 KiB (the
// max-message-size of aiortc and of Chromium), and the server echoes the item back in one message
const IMAGE_MAX_CHARS = 200000;
const IMAGE_QUALITIES = [0.85, 0.7, 0.55]; // JPEG qualities tried at each size, best first

async function shrinkImage(file) {
  // a JPEG data URL of at most IMAGE_MAX_CHARS: scaled to IMAGE_MAX_SIDE, then smaller until it fits
  const bitmap = await createImageBitmap(file); // decodes PNG, JPEG, WebP, GIF, HEIC where supported
  let scale = Math.min(1, IMAGE_MAX_SIDE / Math.max(bitmap.width, bitmap.height));
  for (let attempt = 0; attempt < 8; attempt++) {
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, Math.round(bitmap.width * scale));
    canvas.height = Math.max(1, Math.round(bitmap.height * scale));
    canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    for (const quality of IMAGE_QUALITIES) {
      const url = canvas.toDataURL("image/jpeg", quality);
      if (url.length <= IMAGE_MAX_CHARS) {
        bitmap.close();
        return { url, width: canvas.width, height: canvas.height };
      }
    }
    scale *= 0.7;
  }
  bitmap.close();
  throw new Error("it cannot be made small enough to send");
}

// button: "Attach image"; input: the hidden file input; state: the page's (channel, connected,
// images); say(text, kind) and bubble(role, label) are the page's. Returns {sync, onError}.
export function setupImages({ button, input, state, say, bubble }) {
  state.images = []; // {eventId, el, width, height, chars, refused}: the images sent, in order

  async function attach(file) {
    if (!file) return;
    if (!state.channel || state.channel.readyState !== "open") {
      say("Connect first, then attach an image.", "warn");
      return;
    }
    let image;
    try {
      image = await shrinkImage(file);
    } catch (err) {
      say(`That image cannot be sent: ${err.message || "the browser cannot read it"}.`, "error");
      return;
    }
    const eventId = `evt_image_${Date.now()}_${state.images.length}`;
    const part = { type: "input_image", image_url: image.url, detail: "auto" };
    const item = { type: "message", role: "user", content: [part] };
    state.channel.send(JSON.stringify({ type: "conversation.item.create", event_id: eventId, item }));
    const el = bubble("user image", "you");
    const img = document.createElement("img");
    img.src = image.url;
    img.alt = "the image you attached";
    el.querySelector(".text").appendChild(img);
    state.images.push({ eventId, el, width: image.width, height: image.height, chars: image.url.length, refused: null });
    say("Image sent: ask about it.", "ok");
  }

  button.addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    const file = input.files[0];
    input.value = ""; // the same photo can be chosen again
    attach(file);
  });

  return {
    sync() {
      button.disabled = !state.connected;
    },
    onError(err) {
      // an error event naming an image's event: the server did not take it
      const image = state.images.find((i) => err.event_id && i.eventId === err.event_id);
      if (!image) return;
      image.refused = err.message || "refused";
      image.el.classList.add("refused");
      const note = document.createElement("span");
      note.className = "note";
      note.textContent = "not seen";
      image.el.querySelector(".role").appendChild(note);
    },
  };
}
