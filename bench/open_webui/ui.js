// Types a question into Open WebUI's chat box, waits for the streamed answer to settle, saves a screenshot (run.sh).
const puppeteer = require('puppeteer-core');
const fs = require('fs');
(async () => {
  const token = fs.readFileSync(process.env.TOKEN_FILE, 'utf8').trim();
  const browser = await puppeteer.launch({executablePath: '/usr/bin/chromium', headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--window-size=1280,800']});
  const page = await browser.newPage();
  await page.setViewport({width: 1280, height: 800});
  await page.goto('http://127.0.0.1:18081/', {waitUntil: 'networkidle2', timeout: 120000});
  await page.evaluate(t => localStorage.setItem('token', t), token);
  await page.goto('http://127.0.0.1:18081/', {waitUntil: 'networkidle2', timeout: 120000});
  const box = await page.waitForSelector('#chat-input', {timeout: 60000});
  await box.click();
  await page.keyboard.type('What colour is the sky on a clear day?');
  await page.keyboard.press('Enter');
  const t0 = Date.now(); let stable = 0;
  page.on('console', m => { if (m.type() === 'error') console.log('console:', m.text().slice(0, 200)); });
  // wait until the answer is done: the regenerate button appears under the answer
  let last = '';
  for (let i = 0; i < 150; i++) {  // up to 5 minutes: the answer's text stops changing for 10 s
    await new Promise(r => setTimeout(r, 2000));
    const now = await page.evaluate(() => document.querySelector('#messages-container')?.innerText || '');
    if (now === last && now.length > 60 && i > 5) { if (++stable >= 5) break; } else stable = 0;
    last = now;
  }
  console.log('answer after', (Date.now() - t0) / 1000, 's');
  await new Promise(r => setTimeout(r, 1000));
  await page.screenshot({path: process.env.SHOT});
  const text = await page.evaluate(() => document.querySelector('#messages-container')?.innerText || document.body.innerText);
  console.log(text.slice(0, 800));
  await browser.close();
})();
