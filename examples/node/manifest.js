'use strict';
// A tfm-export model directory's manifest.json, checked for the format these examples read.

const fs = require('fs');
const path = require('path');

function readManifest(dir) {
  const manifest = JSON.parse(fs.readFileSync(path.join(dir, 'manifest.json'), 'utf8'));
  if (manifest.format !== 'tfm-export-model' || manifest.format_version !== 2) {
    throw new Error(`${dir}: not a tfm-export model directory (format version 2)`);
  }
  return manifest;
}

module.exports = { readManifest };
